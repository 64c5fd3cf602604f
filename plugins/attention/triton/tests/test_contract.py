"""kvserve-attention-triton passes the attention backend contract, in the interpreter without a GPU.

Core's contract on this branch may still drive the old interface (``forward(..., scale)``,
class-level ``kv_cache_shape(num_blocks, block_size, kv_heads, head_dim)``); until the attention
seam lands, the contract runs the backend through a private adapter speaking it. Once core's
``AttentionSpec`` has ``layers``, the registered backend is tested as it is.
"""

from __future__ import annotations

import dataclasses

import torch

from kvserve.interfaces import AttentionSpec
from kvserve_attention_triton.backend import TritonAttentionBackend
from kvserve_attention_triton.contract import TritonAttentionContract

SEAM = "layers" in {f.name for f in dataclasses.fields(AttentionSpec)}


class _OldInterface(TritonAttentionBackend):
    """The backend behind the pre-seam interface: a spec without layers, the scale per call."""

    @dataclasses.dataclass(frozen=True)
    class _Layer:
        scale: float
        sliding_window: int | None = None
        logits_soft_cap: float | None = None

    def __init__(self, spec) -> None:
        super().__init__(spec)
        self._scale = None

    @classmethod
    def kv_cache_shape(cls, num_blocks, block_size, num_kv_heads, head_dim):  # the old classmethod
        return (2, num_blocks, block_size, num_kv_heads, head_dim)

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata, scale: float) -> torch.Tensor:
        layers = (self._Layer(scale),)
        spec, self.spec = self.spec, type("Spec", (), {"layers": layers})()
        try:
            return super().forward(query, kv_cache, metadata, 0)
        finally:
            self.spec = spec


class TestTritonAttentionBackend(TritonAttentionContract):
    backend = "triton"
    if not torch.cuda.is_available():
        # the interpreter's time: float16 runs in test_kernels.py; `kvserve plugins check` runs all three
        dtypes = ("float32", "bfloat16")

    if not SEAM:

        @classmethod
        def load_component(cls):
            super().load_component()  # the registered class loads (and the interpreter is set up)
            return _OldInterface
