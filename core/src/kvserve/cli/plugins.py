"""``kvserve plugins``: what is installed and whether it works (``kvserve plugins check``: see cli/check.py)."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvserve.cli.app import app

plugins_app = typer.Typer(
    help="List installed plugins and check them against their contracts.", invoke_without_command=True
)
app.add_typer(plugins_app, name="plugins")


@plugins_app.callback()
def plugins(ctx: typer.Context) -> None:
    """Show every plugin: name, package, version, kind, API version and status."""
    if ctx.invoked_subcommand is not None:
        return
    from kvserve.plugins import get_plugin_manager

    manager = get_plugin_manager()
    table = Table(title="kvserve plugins")
    for column in ("plugin", "package", "version", "kind", "name", "API", "status"):
        table.add_column(column)
    listed = set()
    for registry in manager.registries.values():
        for reg in registry.entries():
            listed.add(reg.plugin)
            table.add_row(
                reg.plugin, reg.package, reg.version, reg.kind, reg.name, str(reg.api_version), escape(_status(reg))
            )
    for info in manager.plugins.values():
        if info.name not in listed:
            table.add_row(info.name, info.package, info.version, "-", "-", "-", info.status)
    Console().print(table)


def _status(reg) -> str:
    """``ok``, the registration's problem, or the ``unavailable`` fact a plugin gives when a library
    it needs is missing (it stays selectable, and refuses with that reason)."""
    if reg.problem:
        return reg.problem
    unavailable = reg.facts.get("unavailable")
    return f"unavailable: {unavailable}" if unavailable else "ok"
