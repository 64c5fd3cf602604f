"""The AttentionBackend interface, the spec it is built from and the per-step batch description it consumes."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import numpy as np
    import torch

    from kvserve.interfaces.platform import Platform
    from kvserve.optional_library import OptionalLibrary


@dataclass(frozen=True)
class LayerAttentionSpec:
    """One attention layer's facts. A model may mix kinds (Gemma 3: sliding local and full global
    layers; Qwen2 with ``max_window_layers``), so the spec holds one per layer."""

    scale: float
    """Softmax scale: scores are ``q · k * scale``."""
    sliding_window: int | None = None
    """The query at position ``p`` sees the keys at positions ``j`` with ``p - sliding_window < j <= p``
    (``sliding_window`` keys, its own included); None: every earlier key (plain causal)."""
    logits_soft_cap: float | None = None
    """Scores become ``cap * tanh(scores / cap)`` (after scaling, before the mask and softmax); None: no cap."""


@dataclass(frozen=True)
class AttentionSpec:
    """What a model's attention layers need: fixed for the lifetime of an engine."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    """Query and output dtype (the model's dtype)."""
    block_size: int
    device: torch.device
    layers: tuple[LayerAttentionSpec, ...]
    """One entry per attention layer; ``layers[layer_idx]`` holds the facts of that layer
    (see :func:`kvserve.layers.attention_layers`)."""
    kv_cache_dtype: torch.dtype | None = None
    """The dtype K and V are stored in; None: the same as :attr:`dtype`."""

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def cache_dtype(self) -> torch.dtype:
        """The dtype of the KV cache: :attr:`kv_cache_dtype`, else :attr:`dtype`."""
        return self.kv_cache_dtype or self.dtype

    @property
    def layer_kinds(self) -> tuple[LayerAttentionSpec, ...]:
        """The distinct layer specs, in order of first appearance (what a backend plans once per step)."""
        return tuple(dict.fromkeys(self.layers))


@dataclass
class AttentionBatch:
    """The attention-relevant description of one engine step, built once per step.

    Sequences are laid out back to back in the flattened token dimension: sequence ``i``
    owns tokens ``query_start_loc[i]:query_start_loc[i+1]``. Its new tokens sit at
    positions ``context_lens[i] .. seq_lens[i]-1``: a decode has one new token, a (chunked)
    prefill several; one batch mixes both freely. All tensors are on the engine's device;
    the ``*_host`` fields hold the same numbers on the host, so that backends plan without a
    device sync.
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
    """int64 ``[num_tokens]``: the cache slot (``block * block_size + offset``) of each new token;
    -1 marks a padded token whose K/V must not be stored."""
    query_start_loc_host: list[int]
    seq_lens_host: list[int]
    context_lens_host: list[int]
    block_tables_host: np.ndarray
    """int32 ``[num_seqs, max_blocks]``: the same numbers as :attr:`block_tables`, on the host."""
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

    The engine builds one instance from an :class:`AttentionSpec` before it sizes the KV
    cache: it asks :meth:`kv_cache_bytes_per_block` and :meth:`workspace_bytes` to size the
    pool, then :meth:`allocate_kv_cache` for it. Each step it calls :meth:`build_metadata`
    once, then for every layer :meth:`write_kv` followed by :meth:`forward`.

    Tensors: ``query`` is ``[num_tokens, num_heads, head_dim]``, ``key`` and ``value`` are
    ``[num_tokens, num_kv_heads, head_dim]``; they may be non-contiguous views (the Llama model
    slices them from one fused projection). Query head ``h`` attends to KV head
    ``h // (num_heads // num_kv_heads)`` (GQA/MQA). Attention is causal over each sequence's
    positions ``0 .. seq_len-1``, limited by the layer's sliding window and soft-capped as its
    :class:`LayerAttentionSpec` says.

    Freeing blocks that fall out of a sliding window is not the backend's business: block
    tables come from the KV cache manager (see :class:`~kvserve.interfaces.KVCacheManager`),
    and a backend must never read keys outside a layer's window, whatever the table holds there.
    """

    name: ClassVar[str]
    """Registry name, e.g. ``"cpu"``."""
    device_types: ClassVar[tuple[str, ...]]
    """Platform device types the backend runs on (``"cpu"``, ``"cuda"``)."""
    supported_dtypes: ClassVar[tuple[str, ...]]
    """Query/KV dtypes as torch dtype names."""
    supported_head_sizes: ClassVar[tuple[int, ...] | None] = None
    """Head sizes the backend has kernels for; None: any."""
    block_size_multiple: ClassVar[int] = 1
    """Block sizes must be a multiple of this (FlashAttention 2: 256)."""
    default_block_size: ClassVar[int] = 16
    """Block size used under ``block_size="auto"``; must be a multiple of ``block_size_multiple``."""
    kv_cache_in_model_dtype: ClassVar[bool] = False
    """True: K/V are stored only in the model dtype; the base refuses any other ``spec.kv_cache_dtype``."""
    required_library: ClassVar[OptionalLibrary | None] = None
    """The optional library the kernels come from; the base refuses while it is missing or of an
    unsupported version (with :meth:`~kvserve.optional_library.OptionalLibrary.missing_reason`)."""

    def __init__(self, spec: AttentionSpec) -> None:
        """Called once per engine, before the KV cache is sized; keep ``spec`` as ``self.spec``."""
        self.spec = spec

    @classmethod
    def unsupported_reasons(cls, spec: AttentionSpec, platform: Platform) -> list[str]:
        """Every reason this backend cannot serve ``spec`` on ``platform`` (empty: it can).

        The same list drives ``auto`` selection and the error shown when a user forces the
        backend, so each reason is a readable sentence (``"dtype float16 not supported
        (supported: float32, bfloat16)"``). The base checks platform, dtype, block size, head
        counts, :attr:`supported_head_sizes`, :attr:`kv_cache_in_model_dtype`,
        :attr:`required_library` and :meth:`required_capability`; subclasses extend them, e.g. a backend that
        cannot apply a sliding window or a soft-cap refuses a spec whose ``layers`` use one,
        with a reason naming it (``"sliding window not supported"``, ``"logits soft-cap not
        supported"``), or a KV cache dtype it cannot store.
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
        if cls.supported_head_sizes is not None and spec.head_dim not in cls.supported_head_sizes:
            sizes = ", ".join(map(str, cls.supported_head_sizes))
            reasons.append(f"head size {spec.head_dim} not supported (supported: {sizes})")
        if cls.kv_cache_in_model_dtype and spec.cache_dtype != spec.dtype:
            cache_dtype = str(spec.cache_dtype).removeprefix("torch.")
            reasons.append(f"KV cache dtype {cache_dtype} not supported (this backend keeps K/V in the model dtype)")
        missing = cls.required_library.missing_reason() if cls.required_library is not None else None
        if missing:
            reasons.append(missing)
        need = cls.required_capability(spec)
        if need is not None and platform.device_type in cls.device_types:
            capability = platform.capability()
            if capability.major is not None and not capability.at_least(*need):
                reasons.append(
                    f"needs a device of compute capability {need[0]}.{need[1]} or newer for {dtype}; "
                    f"{capability.name} is {capability.major}.{capability.minor}"
                )
        return reasons

    @classmethod
    def required_capability(cls, spec: AttentionSpec) -> tuple[int, int] | None:
        """The oldest device architecture ``(major, minor)`` (CUDA: compute capability) the kernels
        serve ``spec`` on; None (the default): any. :meth:`unsupported_reasons` refuses older
        devices of a versioned architecture, naming the device and ``spec.dtype``."""
        return None

    def kernels(self) -> str:
        """A short account of the kernels this instance runs for ``self.spec`` (for the engine's
        start-up line and ``kvserve bench``), e.g. ``"decode: grouped matmul, prefill: SDPA"``.

        Readers see it verbatim; it is not parsed. The default is empty (nothing to add to :attr:`name`).
        """
        return ""

    @abstractmethod
    def kv_cache_shape(self, num_blocks: int) -> tuple[int, ...]:
        """Shape of one layer's KV cache tensor (K and V of ``num_blocks`` blocks) in this backend's layout."""

    def kv_cache_bytes_per_block(self) -> int:
        """Bytes one block takes in one layer: K and V, plus any scale tensors the backend keeps.

        The engine sizes the pool as ``(budget - workspace_bytes()) // (this * num_layers)``.
        The default counts :meth:`kv_cache_shape` in ``spec.cache_dtype``; override it when
        :meth:`allocate_kv_cache` allocates more per block.
        """
        return math.prod(self.kv_cache_shape(1)) * self.spec.cache_dtype.itemsize

    def workspace_bytes(self) -> int:
        """Device bytes the backend needs besides the KV cache (e.g. a planner's scratch buffer).

        The engine reserves them from the KV budget; the backend allocates them itself (say,
        in :meth:`allocate_kv_cache`). Default 0.
        """
        return 0

    def allocate_kv_cache(self, num_blocks: int) -> list[Any]:
        """One KV cache per layer (``spec.num_layers`` entries), each holding ``num_blocks`` blocks.

        What an entry is belongs to the backend: :meth:`write_kv` and :meth:`forward` receive
        it back. The default is a zeroed tensor of
        :meth:`kv_cache_shape` in ``spec.cache_dtype`` on ``spec.device`` per layer.
        """
        import torch

        shape = self.kv_cache_shape(num_blocks)
        return [
            torch.zeros(shape, dtype=self.spec.cache_dtype, device=self.spec.device)
            for _ in range(self.spec.num_layers)
        ]

    @abstractmethod
    def build_metadata(self, batch: AttentionBatch) -> Any:
        """Per-step metadata for :meth:`write_kv` and :meth:`forward`, shared by all layers.

        Plan here, once per step, from the ``*_host`` fields of ``batch`` (reading the device
        tensors on the host would sync); per-layer facts are in ``self.spec.layers``, their
        distinct kinds in ``self.spec.layer_kinds``.
        """

    @abstractmethod
    def write_kv(self, kv_cache: Any, key: torch.Tensor, value: torch.Tensor, metadata: Any) -> None:
        """Store this step's ``key``/``value`` rows in ``kv_cache`` at ``batch.slot_mapping``, in place.

        Tokens whose slot is -1 (padding) are skipped. No other slot may change.
        """

    @abstractmethod
    def forward(self, query: torch.Tensor, kv_cache: Any, metadata: Any, layer_idx: int) -> torch.Tensor:
        """Causal attention of ``query`` over each sequence's cached KV (this step's included),
        with the scale, sliding window and soft-cap of ``self.spec.layers[layer_idx]``.

        Returns ``[num_tokens, num_heads, head_dim]`` in the query's dtype; never writes the cache.
        """
