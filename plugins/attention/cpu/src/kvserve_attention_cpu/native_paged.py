"""The step metadata of the C++ operators (``paged_attention.cpp``, ``cache_write.cpp``) and the calls.

The kernel attends every sequence of a step, decodes and prefill chunks alike: it reads K/V in
place through the block tables (no gather, no padding to the longest sequence). It replaced SDPA
over gathered K/V for large prefill chunks once its softmax was vectorized; measured per layer,
SmolLM2's 9/3 heads of 64, bfloat16, two threads, kernel vs SDPA (``benchmarks/attention_kernels.py``
shapes): a 512-token chunk after 2,488 cached 13.5 vs 25.0 ms; one 1,024-token prompt 4.6 vs
11.9 ms; 2 prompts of 300 0.82 vs 3.07 ms; 4 of 128 0.33 vs 1.43 ms; 8 of 64 0.19 vs 1.03 ms;
32 chunks of 8 after 200 cached 0.47 vs 3.19 ms. On a 2-core AMD Zen 3 (AVX2), float32: the
512-token chunk 24.5 vs 32 ms, 4 prompts of 128 0.70 vs 1.9 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.interfaces import AttentionBatch


@dataclass
class NativePagedMetadata:
    batch: AttentionBatch
    block_tables: torch.Tensor
    """int32 ``[num_seqs, max_blocks]``, contiguous (what the kernel reads)."""
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata: NativePagedMetadata) -> None:
    """The step's new K/V rows into their slots (padding rows, slot -1, are skipped), in one op."""
    head_dim = kv_cache.shape[-1]
    key, value = (t if t.stride(-1) == 1 and t.stride(-2) == head_dim else t.contiguous() for t in (key, value))
    torch.ops.kvserve_attention_cpu.write_kv(kv_cache, key, value, metadata.batch.slot_mapping)


def attend(out: torch.Tensor, query: torch.Tensor, kv_cache: torch.Tensor, metadata: NativePagedMetadata, layer):
    """The kernel's attention of every sequence into its rows of ``out``."""
    torch.ops.kvserve_attention_cpu.paged_attention_out(
        out,
        query,
        kv_cache,
        metadata.block_tables,
        metadata.seq_lens,
        metadata.query_start_loc,
        layer.scale,
        layer.sliding_window or 0,
        layer.logits_soft_cap or 0.0,
    )
