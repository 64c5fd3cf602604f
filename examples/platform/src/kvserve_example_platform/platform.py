"""A CPU platform with a fixed KV cache budget: the smallest complete Platform."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

from kvserve.interfaces import Platform


class FixedBudgetCpuPlatform(Platform):
    """Runs on the host CPU; the KV cache gets 256 MiB unless the config says otherwise."""

    name = "example_cpu"
    device_type = "cpu"
    supported_dtypes = ("float32", "bfloat16")
    default_dtype = "float32"
    preferred_attention_backends = ("cpu", "naive")
    distributed_backend = "gloo"

    KV_CACHE_BYTES = 256 << 20

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None  # a CPU is always there

    def device(self) -> torch.device:
        return torch.device("cpu")

    def profile_peak_memory(self, fn: Callable[[], object]) -> int:
        fn()
        return 0  # the fixed budget below does not depend on it

    def kv_cache_memory_bytes(self, peak_activation_bytes: int, fraction: float | None) -> int:
        return self.KV_CACHE_BYTES if fraction is None else int(self.KV_CACHE_BYTES * fraction)

    def synchronize(self) -> None:
        """CPU operations are finished when they return."""

    def seed_everything(self, seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)
