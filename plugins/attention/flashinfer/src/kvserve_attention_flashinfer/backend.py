"""FlashInfer over a paged KV cache: each step plans a prefill wrapper (steps with prefills) or a
decode wrapper (decode-only steps) once per distinct layer kind, then every layer runs its kind's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from kvserve.interfaces import AttentionBackend
from kvserve.layers.kv_store import store_kv
from kvserve_attention_flashinfer.library import FLASHINFER
from kvserve_attention_flashinfer.page_table import page_tables

if TYPE_CHECKING:
    from kvserve.interfaces import AttentionBatch, AttentionSpec, LayerAttentionSpec

WORKSPACE_BYTES = 128 * 1024 * 1024
"""The float workspace all wrappers share (split-KV partial results while a kernel runs)."""


def window_left(sliding_window: int | None) -> int:
    """FlashInfer's ``window_left`` (keys a query sees before itself; -1: all) for a window of
    ``sliding_window`` keys, the query's own included."""
    return -1 if sliding_window is None else sliding_window - 1


@dataclass(frozen=True)
class FlashInferMetadata:
    """One step's planned wrappers, shared by every layer."""

    wrappers: tuple[Any, ...]
    """Per layer kind (index into ``spec.layer_kinds``), the wrapper planned for this step."""
    num_tokens: int
    """Query rows the wrappers were planned for; rows past it are CUDA-graph padding."""
    slot_mapping: torch.Tensor


class FlashInferBackend(AttentionBackend):
    """KV layout ``(num_blocks, 2, block_size, num_kv_heads, head_dim)``: FlashInfer's "NHD" paged cache.

    Plans are made from the host block tables: ``plan()`` takes host int32 tensors and copies
    them to the device itself, so the step never waits for the GPU. Each layer kind (scale,
    sliding window, soft-cap) has its own pair of wrappers, because a plan fixes those facts.
    """

    name = "flashinfer"
    device_types = ("cuda",)
    supported_dtypes = ("float16", "bfloat16")
    supported_head_sizes = (64, 128, 256)
    default_block_size = 16
    kv_cache_in_model_dtype = True
    required_library = FLASHINFER

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self._kinds = spec.layer_kinds
        self._kind_of_layer = [self._kinds.index(layer) for layer in spec.layers]
        self._workspace: torch.Tensor | None = None
        self._wrappers: list[tuple[Any, Any]] | None = None

    @classmethod
    def required_capability(cls, spec: AttentionSpec) -> tuple[int, int]:
        """FlashInfer runs on Turing (7.5) or newer; bfloat16 needs Ampere (8.0)."""
        return (8, 0) if spec.dtype == torch.bfloat16 else (7, 5)

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """``(num_blocks, 2, block_size, num_kv_heads, head_dim)`` (NHD)."""
        spec = self.spec
        return (num_blocks, 2, spec.block_size, spec.num_kv_heads, spec.head_dim)

    def workspace_bytes(self) -> int:
        """The float workspace (:data:`WORKSPACE_BYTES`) all wrappers share."""
        return WORKSPACE_BYTES

    def allocate_kv_cache(self, num_blocks: int) -> list[torch.Tensor]:
        """The per-layer NHD caches, and (once) the workspace, so that it exists before the
        engine's profiling forward measures peak memory rather than inside it."""
        self._workspace_buffer()
        return super().allocate_kv_cache(num_blocks)

    def build_metadata(self, batch: AttentionBatch) -> FlashInferMetadata:
        """CSR page tables from the host block tables, then one ``plan()`` per layer kind."""
        tables = page_tables(batch.query_start_loc_host, batch.seq_lens_host, batch.block_tables_host, batch.block_size)
        qo_indptr, kv_indptr, kv_indices, last_page_len = map(
            torch.from_numpy,
            (tables.qo_indptr, tables.paged_kv_indptr, tables.paged_kv_indices, tables.paged_kv_last_page_len),
        )
        spec = self.spec
        heads = (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.block_size)
        planned = []
        for kind, (prefill, decode) in zip(self._kinds, self._planners()):
            facts = self._plan_facts(kind)
            if tables.decode_only:
                decode.plan(kv_indptr, kv_indices, last_page_len, *heads, **facts)
                planned.append(decode)
            else:
                prefill.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, *heads, causal=True, **facts)
                planned.append(prefill)
        return FlashInferMetadata(tuple(planned), tables.num_tokens, batch.slot_mapping)

    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata) -> None:
        """Scatter this step's K/V into their slots (padded slots -1 skipped)."""
        store_kv(kv_cache[:, 0], kv_cache[:, 1], key, value, metadata.slot_mapping)

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata, layer_idx: int) -> torch.Tensor:
        """``run()`` of the wrapper planned for this layer's kind."""
        n = metadata.num_tokens
        wrapper = metadata.wrappers[self._kind_of_layer[layer_idx]]
        out = wrapper.run(query[:n].contiguous(), kv_cache)
        return out if n == query.shape[0] else torch.cat([out, out.new_zeros(query.shape[0] - n, *out.shape[1:])])

    def _plan_facts(self, kind: LayerAttentionSpec) -> dict[str, Any]:
        """The keyword arguments both wrappers' ``plan()`` take for a layer kind."""
        return dict(
            sm_scale=kind.scale,
            window_left=window_left(kind.sliding_window),
            logits_soft_cap=kind.logits_soft_cap,
            q_data_type=self.spec.dtype,
            kv_data_type=self.spec.cache_dtype,
        )

    def _planners(self) -> list[tuple[Any, Any]]:
        """A (prefill, decode) wrapper pair per layer kind, sharing one workspace; made on the first
        step, which is also when flashinfer is imported (sizing and storing K/V run without it)."""
        if self._wrappers is None:
            import flashinfer as fi

            workspace = self._workspace_buffer()
            tensor_cores = self.spec.num_heads // self.spec.num_kv_heads >= 4  # FlashInfer's advice for GQA decode
            self._wrappers = [
                (
                    fi.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD"),
                    fi.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores),
                )
                for _ in self._kinds
            ]
        return self._wrappers

    def _workspace_buffer(self) -> torch.Tensor:
        if self._workspace is None:
            self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.spec.device)
        return self._workspace
