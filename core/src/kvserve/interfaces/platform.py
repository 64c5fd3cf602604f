"""The Platform interface: what the engine needs to know about a device kind."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch


class Platform(ABC):
    """A device kind (CPU, CUDA, ...). One instance is made per engine.

    Class attributes are facts the engine reads before instantiating anything heavy.
    """

    name: ClassVar[str]
    """Registry name, e.g. ``"cpu"``."""
    device_type: ClassVar[str]
    """The torch device type, e.g. ``"cpu"`` or ``"cuda"``."""
    supported_dtypes: ClassVar[tuple[str, ...]]
    """Model/KV dtypes this platform runs, as torch dtype names (``"float32"``, ``"bfloat16"``...)."""
    default_dtype: ClassVar[str]
    """Dtype used when the config says ``dtype="auto"``."""
    preferred_attention_backends: ClassVar[tuple[str, ...]]
    """Attention backend names to try first under ``attention_backend="auto"``, best first."""
    distributed_backend: ClassVar[str]
    """The torch.distributed backend for this device (``"gloo"``, ``"nccl"``)."""

    @classmethod
    @abstractmethod
    def unavailable_reason(cls) -> str | None:
        """Why this platform cannot run in this process (``None`` when it can).

        Must be cheap and must not raise: it is called for every installed platform under ``auto``.
        """

    @abstractmethod
    def device(self) -> torch.device:
        """The torch device models and KV caches live on."""

    @abstractmethod
    def profile_peak_memory(self, fn: Callable[[], object]) -> int:
        """Run ``fn`` (the engine's profiling forward) and return the peak extra device memory it used, in bytes.

        A platform that does not measure it may return 0 without running ``fn`` (the CPU does).
        """

    @abstractmethod
    def kv_cache_memory_bytes(self, peak_activation_bytes: int, fraction: float | None) -> int:
        """Bytes the KV cache (every layer, plus the backend's workspace) may use when the config
        gives neither a budget nor a block count.

        ``peak_activation_bytes`` is what :meth:`profile_peak_memory` measured for a forward at
        ``max_num_batched_tokens``; ``fraction`` is the config's ``kv_cache_memory_fraction``
        (None: the platform's default share).
        """

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until queued device work is finished (a no-op on synchronous devices)."""

    @abstractmethod
    def seed_everything(self, seed: int) -> None:
        """Seed every random number generator the platform's computations use."""
