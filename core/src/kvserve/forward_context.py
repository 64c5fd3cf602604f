"""The one small object that carries a step's attention state and per-token metadata through the model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

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
    token_metadata: dict[str, torch.Tensor] = field(default_factory=dict)
    """Name -> int64 ``[num_tokens]`` on the model's device, one value per token of the forward
    (its ``input_ids``, padding included: padded tokens carry -1), as the step input's
    ``token_metadata`` gave it; e.g. which LoRA adapter each token's request uses."""


_current: ForwardContext | None = None


@contextmanager
def current_forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    """Within the block, :func:`get_forward_context` returns ``ctx``.

    The runner runs every forward inside it, so layers the context is not passed to (a linear
    layer reading ``token_metadata``) find it here; a compiled model cannot take the context
    through its graph (it is no tensor), so the attention op of a compiled forward reads it from
    here too.
    """
    global _current
    previous, _current = _current, ctx
    try:
        yield ctx
    finally:
        _current = previous


def get_forward_context() -> ForwardContext:
    """The context of the forward now running (see :func:`current_forward_context`)."""
    if _current is None:
        raise RuntimeError("no forward context is set: run the model inside current_forward_context(ctx)")
    return _current
