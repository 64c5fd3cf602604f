"""The ``kvserve`` command line (typer)."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from kvserve.errors import KvserveError

app = typer.Typer(help="kvserve: a pluggable LLM inference and serving engine.", no_args_is_help=True)


def load_commands() -> None:
    """Import every command module: each registers its commands on ``app``."""
    from kvserve.cli import bench, chat, check, generate, plugins, serve  # noqa: F401


def main() -> None:
    load_commands()
    try:
        app()
    except KvserveError as exc:
        # Escaped: messages hold brackets ("pip install 'kvserve-core[server]'") that are not markup.
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
