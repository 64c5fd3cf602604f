"""The ``kvserve`` command line (typer): one module per command group, all added to one app."""

from kvserve.cli.app import app, main

__all__ = ["app", "main"]
