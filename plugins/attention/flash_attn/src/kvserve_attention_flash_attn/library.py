"""Whether a usable flash-attn is installed, answered from package metadata without importing it."""

from __future__ import annotations

import re
from importlib import metadata

SUPPORTED = ">=2.6.0,<3"
"""flash-attn versions this backend is written for: ``flash_attn_varlen_func`` takes ``block_table``
since 2.5.7 and ``softcap`` since 2.6.0; 3.x is FlashAttention 3, another API."""
INSTALL = "pip install kvserve-attention-flash-attn[gpu]"


def missing_reason() -> str | None:
    """Why flash-attn cannot be used (not installed, or a version outside :data:`SUPPORTED`); None if it can."""
    try:
        version = metadata.version("flash-attn")
    except metadata.PackageNotFoundError:
        return f"flash-attn is not installed ({INSTALL})"
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or not (2, 6) <= (int(match[1]), int(match[2])) < (3, 0):
        return f"flash-attn {version} is installed, but this backend needs flash-attn {SUPPORTED} ({INSTALL})"
    return None
