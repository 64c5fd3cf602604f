"""The CPU platform: always available, float32 by default, KV cache in host memory."""

from __future__ import annotations

import random

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

    def kv_cache_memory_bytes(self) -> int:
        return int(min(psutil.virtual_memory().available * KV_CACHE_MEMORY_FRACTION, KV_CACHE_MEMORY_CAP))

    def synchronize(self) -> None:
        """CPU ops complete before they return."""

    def seed_everything(self, seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)
