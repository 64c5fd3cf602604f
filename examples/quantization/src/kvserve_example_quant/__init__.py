"""Example kvserve quantization method plugin (see docs/plugins.md)."""
