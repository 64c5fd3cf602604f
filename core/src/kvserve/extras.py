"""Optional dependency groups of kvserve-core and the clear error when one is missing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kvserve.errors import MissingExtraError

EXTRA_MODULES: dict[str, frozenset[str]] = {
    "server": frozenset({"fastapi", "starlette", "uvicorn", "prometheus_client", "httpx", "openai"}),
    "ray": frozenset({"ray"}),
}
"""Top-level modules each extra of ``kvserve-core`` installs (see core/pyproject.toml)."""


@contextmanager
def requires_extra(extra: str, feature: str) -> Iterator[None]:
    """Imports inside the block that fail for a module of ``extra`` raise :class:`MissingExtraError`
    saying ``feature`` needs ``pip install 'kvserve-core[extra]'``; other import errors pass through."""
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in EXTRA_MODULES[extra]:
            raise
        raise MissingExtraError(
            f"{feature} needs the {extra!r} extra of kvserve-core (module {missing!r} is not installed): "
            f"pip install 'kvserve-core[{extra}]'"
        ) from exc
