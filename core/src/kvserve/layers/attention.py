"""The attention layer models use: writes this step's KV and attends through the engine's backend."""

from __future__ import annotations

import torch

from kvserve.forward_context import ForwardContext


class PagedAttention(torch.nn.Module):
    """Stateless apart from its layer index and KV-cache scales; the KV cache lives in the forward context.

    ``k_scale`` / ``v_scale`` (float32 scalars, 1.0 unless the checkpoint has them) are the
    per-layer scales of a quantized (fp8) KV cache, loaded for backends that keep one.
    """

    optional_params = frozenset({"k_scale", "v_scale"})

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, layer_idx: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.layer_idx = layer_idx
        self.k_scale = torch.nn.Parameter(torch.ones((), dtype=torch.float32), requires_grad=False)
        self.v_scale = torch.nn.Parameter(torch.ones((), dtype=torch.float32), requires_grad=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``q``: ``[T, heads, head_dim]``, ``k``/``v``: ``[T, kv_heads, head_dim]`` → ``[T, heads * head_dim]``."""
        kv_cache = ctx.kv_caches[self.layer_idx]
        ctx.backend.write_kv(kv_cache, k, v, ctx.metadata)
        out = ctx.backend.forward(q, kv_cache, ctx.metadata, self.scale)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)
