"""The C++ operators (``paged_attention.cpp``, ``cache_write.cpp``): built on first use, or why not."""

from __future__ import annotations

from pathlib import Path

import kvserve_cpu_native as native

LIBRARY = "kvserve_attention_cpu"
SOURCES = (Path(__file__).with_name("paged_attention.cpp"), Path(__file__).with_name("cache_write.cpp"))


def unavailable_reason() -> str | None:
    """None once ``torch.ops.kvserve_attention_cpu`` (``paged_attention_out``, ``write_kv``) is loaded in this process
    (building it if needed); else why it cannot be (see :func:`kvserve_cpu_native.unavailable_reason`)."""
    return native.unavailable_reason(LIBRARY, SOURCES)
