"""kvserve: a paged-KV, continuously batched LLM engine whose every part is a plugin.

Importing ``kvserve`` is cheap: torch and the engine load on first use of ``LLM``.
"""

from typing import TYPE_CHECKING

import pluggy

from kvserve.registry import PLUGIN_API_VERSION

hookimpl = pluggy.HookimplMarker("kvserve")
"""Marker for plugin hook implementations: ``@kvserve.hookimpl``."""

__version__ = "0.1.0"
__all__ = ["LLM", "PLUGIN_API_VERSION", "SamplingParams", "hookimpl"]

if TYPE_CHECKING:
    from kvserve.entrypoints.llm import LLM
    from kvserve.sampling_params import SamplingParams


def __getattr__(name: str):
    if name == "LLM":
        from kvserve.entrypoints.llm import LLM

        return LLM
    if name == "SamplingParams":
        from kvserve.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'kvserve' has no attribute {name!r}")
