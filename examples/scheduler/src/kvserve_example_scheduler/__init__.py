"""Example kvserve scheduler plugin (see docs/plugins.md)."""
