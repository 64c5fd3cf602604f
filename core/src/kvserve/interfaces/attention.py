"""The AttentionBackend interface and the per-step batch description backends consume."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from kvserve.interfaces.platform import Platform


@dataclass(frozen=True)
class AttentionSpec:
    """What a model's attention layers need: fixed for the lifetime of an engine."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int
    device: torch.device


@dataclass
class AttentionBatch:
    """The attention-relevant description of one engine step, built once per step.

    Sequences are laid out back to back in the flattened token dimension: sequence ``i``
    owns tokens ``query_start_loc[i]:query_start_loc[i+1]``. Its new tokens sit at
    positions ``context_lens[i] .. seq_lens[i]-1``: a decode has one new token, a (chunked)
    prefill several; one batch mixes both freely. All tensors are on the engine's device;
    the ``*_host`` lists hold the same numbers on the host so backends can plan without a sync.
    """

    query_start_loc: torch.Tensor
    """int32 ``[num_seqs + 1]``: prefix sums of the per-sequence new-token counts."""
    seq_lens: torch.Tensor
    """int32 ``[num_seqs]``: tokens in each sequence's KV after this step (cached + new)."""
    context_lens: torch.Tensor
    """int32 ``[num_seqs]``: tokens already in the KV cache before this step."""
    block_tables: torch.Tensor
    """int32 ``[num_seqs, max_blocks]``: physical block ids; unused entries hold the null block 0."""
    slot_mapping: torch.Tensor
    """int64 ``[num_tokens]``: the cache slot (``block * block_size + offset``) of each new token."""
    query_start_loc_host: list[int]
    seq_lens_host: list[int]
    block_size: int

    @property
    def query_lens_host(self) -> list[int]:
        starts = self.query_start_loc_host
        return [end - start for start, end in zip(starts, starts[1:])]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc_host[-1]

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_host, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host, default=0)


class AttentionBackend(ABC):
    """Paged attention for a mixed batch of prefills, chunked prefills and decodes.

    The engine makes one instance per engine from an :class:`AttentionSpec`, calls
    :meth:`build_metadata` once per step, then for every layer :meth:`write_kv` followed by
    :meth:`forward`. Tensors: ``query`` is ``[num_tokens, num_heads, head_dim]``, ``key`` and
    ``value`` are ``[num_tokens, num_kv_heads, head_dim]``; query head ``h`` attends to KV
    head ``h // (num_heads // num_kv_heads)`` (GQA/MQA). Attention is causal over each
    sequence's positions ``0 .. seq_len-1``.
    """

    name: ClassVar[str]
    """Registry name, e.g. ``"cpu"``."""
    device_types: ClassVar[tuple[str, ...]]
    """Platform device types the backend runs on (``"cpu"``, ``"cuda"``)."""
    supported_dtypes: ClassVar[tuple[str, ...]]
    """Query/KV dtypes as torch dtype names."""
    block_size_multiple: ClassVar[int] = 1
    """Block sizes must be a multiple of this (FlashAttention 2: 256)."""
    default_block_size: ClassVar[int] = 16
    """Block size used under ``block_size="auto"``; must be a multiple of ``block_size_multiple``."""
    kv_cache_block_dim: ClassVar[int] = 1
    """Which dimension of :meth:`kv_cache_shape` indexes blocks (used to copy blocks for copy-on-write)."""

    def __init__(self, spec: AttentionSpec) -> None:
        self.spec = spec

    @classmethod
    def unsupported_reasons(cls, spec: AttentionSpec, platform: Platform) -> list[str]:
        """Every reason this backend cannot serve ``spec`` on ``platform`` (empty: it can).

        The same list drives ``auto`` selection and the error shown when a user forces the
        backend, so each reason is a readable sentence (``"dtype float16 not supported
        (supported: float32, bfloat16)"``). Subclasses extend the base checks.
        """
        reasons = []
        if platform.device_type not in cls.device_types:
            reasons.append(f"platform {platform.name!r} not supported (runs on: {', '.join(cls.device_types)})")
        dtype = str(spec.dtype).removeprefix("torch.")
        if dtype not in cls.supported_dtypes:
            reasons.append(f"dtype {dtype} not supported (supported: {', '.join(cls.supported_dtypes)})")
        if spec.block_size % cls.block_size_multiple:
            reasons.append(f"block size {spec.block_size} is not a multiple of {cls.block_size_multiple}")
        if spec.num_heads % spec.num_kv_heads:
            reasons.append(f"{spec.num_heads} query heads do not divide into {spec.num_kv_heads} KV heads")
        return reasons

    @classmethod
    @abstractmethod
    def kv_cache_shape(cls, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
        """Shape of one layer's KV cache tensor (K and V together) in this backend's layout."""

    @abstractmethod
    def build_metadata(self, batch: AttentionBatch) -> Any:
        """Per-step metadata for :meth:`write_kv` and :meth:`forward`, shared by all layers."""

    @abstractmethod
    def write_kv(self, kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, metadata: Any) -> None:
        """Store this step's ``key``/``value`` rows in ``kv_cache`` at ``batch.slot_mapping``, in place.

        No other slot may change.
        """

    @abstractmethod
    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: Any, scale: float) -> torch.Tensor:
        """Causal attention of ``query`` over each sequence's cached KV (this step's included).

        Returns ``[num_tokens, num_heads, head_dim]`` in the query's dtype.
        """
