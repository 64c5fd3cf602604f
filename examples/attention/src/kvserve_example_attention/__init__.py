"""Example kvserve attention backend plugin (see docs/plugins.md)."""
