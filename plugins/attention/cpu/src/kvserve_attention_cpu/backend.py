"""The ``cpu`` attention backend: paged attention on the host, a C++ kernel where one can be built.

Where the C++ operators build (a compiler and ninja: see :mod:`kvserve_cpu_native`), every sequence
of a step, decode or prefill chunk, reads the cache in place through the block tables, and each
layer's new K/V rows are written by one op (:mod:`.native_paged`); otherwise the plain PyTorch
path of the base class runs everything (:mod:`.torch_paged`). :meth:`kernels` says which runs,
and why the fallback when it does.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from kvserve.interfaces import AttentionBatch, AttentionSpec
from kvserve_attention_cpu import native_kernel, native_paged
from kvserve_attention_cpu.native_paged import NativePagedMetadata
from kvserve_attention_cpu.torch_paged import TorchPagedBackend


class CpuAttentionBackend(TorchPagedBackend):
    """KV layout ``(2, num_blocks, block_size, num_kv_heads, head_dim)``: K then V."""

    name = "cpu"
    native: ClassVar[bool] = True
    """Use the C++ kernel where it builds; a subclass that changes the PyTorch path sets False."""

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.fallback_reason = native_kernel.unavailable_reason() if self.native else "disabled by the class"
        """None: the C++ kernel runs; else why the PyTorch path does."""

    def kernels(self) -> str:
        if self.fallback_reason is not None:
            return f"PyTorch fallback ({self.fallback_reason}): {super().kernels()}"
        isa = torch.ops.kvserve_attention_cpu.isa()
        return f"decode and prefill: C++ paged kernel ({isa}) over the blocks in place; K/V writes: C++"

    def build_metadata(self, batch: AttentionBatch):
        if self.fallback_reason is not None:
            return super().build_metadata(batch)
        return NativePagedMetadata(
            batch,
            batch.block_tables.contiguous(),
            batch.seq_lens.contiguous(),
            batch.query_start_loc.contiguous(),
        )

    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata) -> None:
        if not isinstance(metadata, NativePagedMetadata):
            return super().write_kv(kv_cache, key, value, metadata)
        native_paged.write_kv(kv_cache, key, value, metadata)

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata, layer_idx: int) -> torch.Tensor:
        if not isinstance(metadata, NativePagedMetadata):
            return super().forward(query, kv_cache, metadata, layer_idx)
        layer = self.spec.layers[layer_idx]
        if query.stride(-1) != 1:
            query = query.contiguous()
        # rows no sequence owns (padding past the batch's tokens) must not be left uninitialized
        out = torch.empty_like(query) if query.shape[0] == metadata.batch.num_tokens else torch.zeros_like(query)
        native_paged.attend(out, query, kv_cache, metadata, layer)
        return out
