"""The attention layer models use: writes this step's KV and attends through the engine's backend."""

from __future__ import annotations

import torch

from kvserve.forward_context import ForwardContext, get_forward_context
from kvserve.interfaces import LayerAttentionSpec


def write_and_attend(
    ctx: ForwardContext, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int
) -> torch.Tensor:
    """Write layer ``layer_idx``'s new ``k``/``v`` into its paged cache, then attend ``q`` over it
    (the backend's ``write_kv`` and ``forward``); ``[T, heads, head_dim]``."""
    kv_cache = ctx.kv_caches[layer_idx]
    ctx.backend.write_kv(kv_cache, k, v, ctx.metadata)
    return ctx.backend.forward(q, kv_cache, ctx.metadata, layer_idx)


@torch.library.custom_op("kvserve::paged_attention", mutates_args=())
def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> torch.Tensor:
    """One layer's KV write and attention through the current forward context's backend, as one
    opaque op: what a compiled model graph calls, so that the backend (host-side planning, paged
    cache writes) stays outside the graph and the graph depends only on the number of tokens.

    The cache write is a side effect the op does not declare: its output depends on it, and the
    next layer's op depends on that output, so no compiler can reorder or drop it.
    """
    return write_and_attend(get_forward_context(), q, k, v, layer_idx).contiguous()


@paged_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> torch.Tensor:
    return torch.empty_like(q, memory_format=torch.contiguous_format)


class PagedAttention(torch.nn.Module):
    """One attention layer's facts (scale, sliding window, soft-cap) and its layer index; the KV
    cache lives in the forward context. The engine reads the facts of every such module of the
    model (:func:`attention_layers`) into the backend's spec before the first step.

    ``k_scale`` / ``v_scale`` (float32 scalars, 1.0 unless the checkpoint has them) are the
    per-layer scales of a quantized (fp8) KV cache, loaded for backends that keep one.
    """

    optional_params = frozenset({"k_scale", "v_scale"})

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        layer_idx: int,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> None:
        super().__init__()
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window: must be at least 1, got {sliding_window}")
        if logits_soft_cap is not None and logits_soft_cap <= 0:
            raise ValueError(f"logits_soft_cap: must be positive, got {logits_soft_cap}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.layer_idx = layer_idx
        self.spec = LayerAttentionSpec(scale, sliding_window, logits_soft_cap)
        self.k_scale = torch.nn.Parameter(torch.ones((), dtype=torch.float32), requires_grad=False)
        self.v_scale = torch.nn.Parameter(torch.ones((), dtype=torch.float32), requires_grad=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``q``: ``[T, heads, head_dim]``, ``k``/``v``: ``[T, kv_heads, head_dim]`` → ``[T, heads * head_dim]``."""
        if torch.compiler.is_compiling():  # the context is no graph input: the op reads it
            out = torch.ops.kvserve.paged_attention(q, k, v, self.layer_idx)
        else:
            out = write_and_attend(ctx, q, k, v, self.layer_idx)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)


def attention_layers(model: torch.nn.Module) -> tuple[LayerAttentionSpec, ...]:
    """One :class:`LayerAttentionSpec` per :class:`PagedAttention` module of ``model``, by layer index.

    Raises ValueError when the layer indices are not exactly ``0 .. n-1`` (each used once).
    """
    layers = sorted((m.layer_idx, m.spec) for m in model.modules() if isinstance(m, PagedAttention))
    indices = [index for index, _ in layers]
    if indices != list(range(len(indices))):
        raise ValueError(
            f"{type(model).__name__}: PagedAttention layer indices must be 0 .. n-1, each once; got {indices}"
        )
    return tuple(spec for _, spec in layers)
