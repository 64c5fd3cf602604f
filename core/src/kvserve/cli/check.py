"""``kvserve plugins check``: run the contract suites against installed plugins."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from kvserve.cli.plugins import plugins_app


@plugins_app.command("check")
def check(
    names: Annotated[
        list[str] | None,
        typer.Argument(
            help="Components to check: a name ('my_backend'), kind:name ('attention_backend:my_backend'), "
            "a plugin (entry point) or a package name. Default: everything installed."
        ),
    ] = None,
    list_only: Annotated[
        bool, typer.Option("--list", help="Show which contract applies to each installed plugin; run nothing.")
    ] = False,
    keyword: Annotated[str | None, typer.Option("-k", help="Only checks matching this pytest -k expression.")] = None,
    exitfirst: Annotated[bool, typer.Option("-x", "--exitfirst", help="Stop at the first failing check.")] = False,
    seeds: Annotated[
        int | None, typer.Option(help="Random workloads per property-style check (default 4).", min=1)
    ] = None,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="List every check as it runs.")] = False,
) -> None:
    """Run each installed plugin's contract suite (kvserve.testing); exit 1 naming the contracts that fail."""
    from kvserve.testing.check import installed_targets, run_checks, select

    console = Console()
    targets, unmatched = select(installed_targets(), names or [])
    if unmatched:
        Console(stderr=True).print(
            f"[red]error:[/red] no installed plugin matches {', '.join(map(repr, unmatched))} "
            "(see `kvserve plugins check --list`)",
            highlight=False,
        )
        raise typer.Exit(2)
    if list_only:
        table = Table(title="kvserve plugin contracts")
        for column in ("kind", "name", "plugin", "package", "version", "contract", "status"):
            table.add_column(column)
        for t in targets:
            table.add_row(t.kind, t.name, t.plugin, t.package, t.version, t.contract, t.problem or "ok")
        console.print(table)
        return
    try:
        import pytest  # noqa: F401
    except ImportError:
        Console(stderr=True).print("[red]error:[/red] needs pytest: pip install 'kvserve-core[testing]'")
        raise typer.Exit(2) from None
    args = ["-v" if verbose else "-q"]
    args += ["-k", keyword] if keyword else []
    args += ["-x"] if exitfirst else []
    args += [f"--kvserve-seeds={seeds}"] if seeds else []
    code = run_checks(targets, args)

    table = Table(title="kvserve plugins check")
    for column in ("contract", "kind", "name", "package", "passed", "failed", "skipped", "result"):
        table.add_column(column)
    for t in targets:
        counts = [str(len(t.results[o])) for o in ("passed", "failed", "skipped")]
        result = "[green]ok[/green]" if t.ok else f"[red]FAILED[/red] {t.problem or ''}"
        table.add_row(t.contract, t.kind, t.name, t.package, *counts, result)
    console.print(table)
    failed = [t for t in targets if not t.ok]
    for t in failed:
        console.print(
            f"[red]FAILED[/red] {t.contract} for {t.kind} {t.name!r} ({t.package} {t.version})", highlight=False
        )
        for line in [t.problem] if t.problem else _first_failure_per_check(t.failures):
            console.print(f"    {line}", markup=False, highlight=False)
    if failed or code not in (0, 5):  # 5: pytest collected nothing (e.g. -k matched no check)
        raise typer.Exit(1 if failed or code == 1 else code)


def _first_failure_per_check(failures: list[str]) -> list[str]:
    """One line per failing check (test function), its first failing case, and how many failed."""
    by_check: dict[str, list[str]] = {}
    for failure in failures:
        by_check.setdefault(failure.partition("[")[0].partition(":")[0], []).append(failure)
    return [
        f"{cases[0]}" + (f"  (+{len(cases) - 1} more cases)" if len(cases) > 1 else "") for cases in by_check.values()
    ]
