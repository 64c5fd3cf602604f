"""Example kvserve platform plugin (see docs/plugins.md)."""
