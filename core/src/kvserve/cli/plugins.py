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


def _status(reg) -> str:
    """ "ok", the registration's problem, the ``unavailable`` fact a plugin registers when a library it
    needs is missing (it stays selectable and refuses with that reason), or for a platform whether
    it can run in this process."""
    if reg.problem is not None:
        return reg.problem
    if reg.facts.get("unavailable"):
        return f"unavailable: {reg.facts['unavailable']}"
    if reg.kind != "platform":
        return "ok"
    from kvserve.plugins import load_component

    try:
        reason = load_component("platform", reg.name).unavailable_reason()
    except Exception as exc:  # listed, not raised: the table is how a user finds a broken plugin
        return f"failed: {type(exc).__name__}: {exc}"
    return "ok" if reason is None else f"unavailable: {reason}"


@plugins_app.callback()
def plugins(ctx: typer.Context) -> None:
    """Show every plugin: name, package, version, kind, API version and status (platforms: available
    here, or why not)."""
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
            status = escape(_status(reg))  # reasons hold brackets (pip install ...[gpu]) that rich would eat
            table.add_row(reg.plugin, reg.package, reg.version, reg.kind, reg.name, str(reg.api_version), status)
    for info in manager.plugins.values():
        if info.name not in listed:
            table.add_row(info.name, info.package, info.version, "-", "-", "-", info.status)
    Console().print(table)
