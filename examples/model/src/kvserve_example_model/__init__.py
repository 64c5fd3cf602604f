"""Example kvserve model plugin (see docs/plugins.md)."""
