"""The Triton attention backend: paged KV cache, one unified kernel for mixed batches, a
split-KV path for long decodes, and a KV write kernel that skips padded slots.

Importing this module does not import triton; the kernels are imported when the backend is
built, so a test can still switch on ``TRITON_INTERPRET=1`` after discovery.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kvserve.interfaces import AttentionBackend

if TYPE_CHECKING:
    import torch

    from kvserve.interfaces import AttentionBatch, AttentionSpec, Platform
    from kvserve_attention_triton.kernels import QueryBlocks

CPU_HINT = "Triton needs a GPU platform (cuda); on CPU only under TRITON_INTERPRET=1 for tests"


def interpreter_enabled() -> bool:
    """Whether Triton's CPU interpreter is switched on for this process."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass
class TritonAttentionMetadata:
    """One step's device tensors and launch plan, shared by every layer."""

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    tiles: QueryBlocks
    max_seq_len: int
    num_segments: int
    """Key segments of the split-KV path; 1: the unified kernel alone."""


class TritonAttentionBackend(AttentionBackend):
    """Triton paged attention for NVIDIA and AMD GPUs (ROCm builds of torch name their device
    ``cuda`` too). On a CPU it runs only in Triton's interpreter, for tests.

    KV layout (one layer): ``(2, num_blocks, block_size, num_kv_heads, head_dim)``, K then V,
    in the cache dtype. Head sizes that are not powers of two are padded in registers only.
    """

    name = "triton"
    device_types = ("cuda",)
    supported_dtypes = ("float16", "bfloat16", "float32")
    supported_head_sizes: ClassVar[tuple[int, ...] | None] = (64, 80, 96, 128, 256)
    block_size_multiple = 16
    default_block_size = 16
    kv_cache_layout: ClassVar[str] = "(2, num_blocks, block_size, num_kv_heads, head_dim)"
    """The cache tensor's dimensions, in order (K and V stacked first)."""
    split_kv_min_seq_len: ClassVar[int] = 512
    """A batch of decodes takes the split-KV path when its longest sequence has this many tokens..."""
    split_kv_max_programs: ClassVar[int] = 128
    """... and the unified kernel would run fewer programs (query tiles x KV heads) than this."""
    split_kv_segment_len: ClassVar[int] = 256
    """Keys per split-KV segment (at most :attr:`split_kv_max_segments` segments)."""
    split_kv_max_segments: ClassVar[int] = 16

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        from kvserve_attention_triton import kernels  # imports triton and compiles nothing yet

        self._kernels = kernels

    @classmethod
    def unsupported_reasons(cls, spec: AttentionSpec, platform: Platform) -> list[str]:
        """The base checks (head sizes included), plus: a GPU platform (or the CPU one under
        TRITON_INTERPRET=1), triton installed, a cache dtype the kernels store."""
        reasons = super().unsupported_reasons(spec, platform)
        if platform.device_type not in cls.device_types:
            # replace the generic platform refusal with one that says how tests run on CPU
            reasons = [r for r in reasons if f"platform {platform.name!r}" not in r]
            if not (platform.device_type == "cpu" and interpreter_enabled()):
                reasons.insert(0, f"platform {platform.name!r}: {CPU_HINT}")
        if importlib.util.find_spec("triton") is None:
            reasons.append("the triton package is not installed (pip install triton)")
        cache_dtype = str(spec.cache_dtype).removeprefix("torch.")
        if cache_dtype not in cls.supported_dtypes:
            reasons.append(f"KV cache dtype {cache_dtype} not supported (supported: {', '.join(cls.supported_dtypes)})")
        return reasons

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """``(2, num_blocks, block_size, num_kv_heads, head_dim)``."""
        spec = self.spec
        return (2, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)

    def build_metadata(self, batch: AttentionBatch) -> TritonAttentionMetadata:
        """Plan the query tiles on the host (one copy to the device) and pick the split-KV
        path for long decode-only batches that would leave the GPU idle."""
        spec = self.spec
        query_lens = batch.query_lens_host
        tiles = self._kernels.plan_query_blocks(query_lens, spec.num_heads // spec.num_kv_heads, spec.device)
        max_seq_len = batch.max_seq_len
        num_segments = 1
        if (
            max(query_lens, default=0) == 1
            and max_seq_len >= self.split_kv_min_seq_len
            and tiles.count * spec.num_kv_heads < self.split_kv_max_programs
        ):
            num_segments = min(self.split_kv_max_segments, -(-max_seq_len // self.split_kv_segment_len))
        return TritonAttentionMetadata(
            batch.query_start_loc, batch.seq_lens, batch.block_tables, batch.slot_mapping, tiles, max_seq_len,
            num_segments,
        )  # fmt: skip

    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata) -> None:
        """Store ``key``/``value`` (any strides) at ``slot_mapping``; slots of -1 are skipped."""
        self._kernels.write_kv(key, value, kv_cache[0], kv_cache[1], metadata.slot_mapping)

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata, layer_idx: int) -> torch.Tensor:
        """Attention of ``query`` (any strides) with layer ``layer_idx``'s scale, sliding window
        and logit soft-cap; ``[num_tokens, num_heads, head_dim]`` in the query's dtype."""
        layer = self.spec.layers[layer_idx]
        args = (query, kv_cache[0], kv_cache[1], metadata.block_tables, metadata.query_start_loc, metadata.seq_lens)
        options = dict(scale=layer.scale, sliding_window=layer.sliding_window, logits_soft_cap=layer.logits_soft_cap)
        if metadata.num_segments > 1:
            return self._kernels.split_kv_attention(
                *args, metadata.tiles, max_seq_len=metadata.max_seq_len, num_segments=metadata.num_segments, **options
            )
        return self._kernels.unified_attention(*args, metadata.tiles, **options)
