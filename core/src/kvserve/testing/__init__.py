"""Test kit for plugin authors: references and batch builders (imports torch)."""
