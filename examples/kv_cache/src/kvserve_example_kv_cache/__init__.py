"""Example kvserve KV cache manager plugin (see docs/plugins.md)."""
