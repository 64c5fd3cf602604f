"""The one small object that carries a step's attention state through the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvserve.interfaces.attention import AttentionBackend, AttentionBatch


@dataclass
class ForwardContext:
    """Built once per step by the runner and passed to ``model.forward``."""

    backend: AttentionBackend
    batch: AttentionBatch
    metadata: Any
    """The backend's :meth:`~kvserve.interfaces.AttentionBackend.build_metadata` result."""
    kv_caches: list[Any]
    """One entry per layer, as the backend's ``allocate_kv_cache`` made them."""
