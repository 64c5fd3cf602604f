"""The CPU platform: always available, float32 by default, KV cache in host memory."""

from __future__ import annotations

import random
from collections.abc import Callable

import psutil
import torch

from kvserve.interfaces import Platform

# Without an explicit budget the KV cache takes this share of available memory, capped,
# so a laptop user is not surprised by a multi-GiB allocation.
KV_CACHE_MEMORY_FRACTION = 0.25
KV_CACHE_MEMORY_CAP = 4 << 30


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    supported_dtypes = ("float32", "bfloat16", "float16")
    default_dtype = "float32"
    preferred_attention_backends = ("cpu",)
    distributed_backend = "gloo"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def device(self) -> torch.device:
        return torch.device("cpu")

    def profile_peak_memory(self, fn: Callable[[], object]) -> int:
        """0 without running ``fn``: host memory is not measured (the budget is a share of what is
        free), and a full-budget forward would cost seconds of start-up on a CPU."""
        return 0

    def kv_cache_memory_bytes(self, peak_activation_bytes: int, fraction: float | None) -> int:
        """``fraction`` (default 0.25) of available memory less the activation peak, capped at 4 GiB."""
        share = KV_CACHE_MEMORY_FRACTION if fraction is None else fraction
        available = psutil.virtual_memory().available - peak_activation_bytes
        return max(int(min(available * share, KV_CACHE_MEMORY_CAP)), 0)

    def synchronize(self) -> None:
        """CPU ops complete before they return."""

    def seed_everything(self, seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)
