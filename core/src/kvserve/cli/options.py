"""Command-line options every engine-building command shares, and how they become an ``EngineConfig``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kvserve.config import EngineConfig
from kvserve.config_sources import config_fields, parse_assignments

ConfigFile = Annotated[
    Path | None,
    typer.Option("--config", help="YAML or TOML file of config fields (flat, or grouped by section).", dir_okay=False),
]
Assignments = Annotated[
    list[str] | None,
    typer.Option("--set", "-o", help="FIELD=VALUE for any config field, e.g. -o max_num_seqs=8 (repeatable)."),
]
TensorParallelSize = Annotated[
    int | None, typer.Option(help="Tensor-parallel ranks, one worker process or Ray actor each (default: 1).", min=1)
]
ExecutorBackend = Annotated[
    str | None, typer.Option(help="How tensor-parallel workers run: auto, mp or ray (default: auto).")
]
OptimizationLevel = Annotated[
    int | None,
    typer.Option(
        "-O",
        "--optimization-level",
        min=0,
        max=2,
        help="0: eager, quick start; 1: torch.compile per decode-sized token bucket; 2: as 1 with weight freezing "
        "(default: 0).",
    ),
]
ModelOption = Annotated[str | None, typer.Option(help="HF directory or .gguf file (default: the embedded SmolLM2).")]


def resolve_fields(config_file: Path | None, assignments: list[str] | None, **options: Any) -> dict[str, Any]:
    """Flat config fields: defaults < ``--config`` file < ``KVSERVE_*`` env vars < ``--set`` < named options
    (None: not given, so a ``--set`` of the same field stands)."""
    given = {name: value for name, value in options.items() if value is not None}
    return config_fields(config_file, {**parse_assignments(assignments or []), **given})


def resolve_config(config_file: Path | None, assignments: list[str] | None, **options: Any) -> EngineConfig:
    """:func:`resolve_fields`, validated."""
    return EngineConfig.from_flat(**resolve_fields(config_file, assignments, **options))
