"""The C++ paged attention operator (``paged_attention.cpp``): built on first use, or why not."""

from __future__ import annotations

import functools
from pathlib import Path

from kvserve import native

LIBRARY = "kvserve_attention_cpu"
SOURCES = (Path(__file__).with_name("paged_attention.cpp"),)


def unavailable_reason() -> str | None:
    """None once ``torch.ops.kvserve_attention_cpu.paged_attention_out`` is loaded in this process (building it
    if needed); else why it cannot be (no compiler, no ninja, a failed build), as a sentence.

    The build tools are checked on every call (``CXX`` may change), the build itself at most once
    per process."""
    reason = native.build_failure_reason()
    if reason is not None:
        return reason
    return _load()


@functools.cache
def _load() -> str | None:
    try:
        native.load_operators(LIBRARY, SOURCES)
    except native.NativeBuildError as error:
        return str(error)
    return None
