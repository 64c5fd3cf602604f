"""Whether a usable FlashInfer is installed, answered from package metadata without importing it."""

from __future__ import annotations

import re
from importlib import metadata

SUPPORTED = ">=0.2.0,<0.8"
"""flashinfer-python versions this backend is written for: ``plan()``/``run()`` exist since 0.2.0,
and the argument names it passes are the same from 0.2.0 to 0.7."""
INSTALL = "pip install kvserve-attention-flashinfer[gpu]"


def missing_reason() -> str | None:
    """Why FlashInfer cannot be used (not installed, or a version outside :data:`SUPPORTED`); None if it can."""
    try:
        version = metadata.version("flashinfer-python")
    except metadata.PackageNotFoundError:
        return f"flashinfer is not installed ({INSTALL})"
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None or not (0, 2) <= (int(match[1]), int(match[2])) < (0, 8):
        return f"flashinfer-python {version} is installed, but this backend needs {SUPPORTED} ({INSTALL})"
    return None
