"""The CUDA platform: one NVIDIA GPU through torch.cuda, KV cache sized from free memory after profiling."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable

import torch

from kvserve import distributed
from kvserve.interfaces import DeviceCapability, LinearKernel, LoRAKernel, Platform
from kvserve_platform_cuda import capability as sm

logger = logging.getLogger("kvserve")

KV_CACHE_MEMORY_FRACTION = 0.9
"""Default share of free memory (after weights and the profiled activation peak) the KV cache takes;
the rest covers what torch's allocator does not see: cuBLAS/NCCL workspaces, fragmentation."""


class CudaPlatform(Platform):
    name = "cuda"
    device_type = "cuda"
    supported_dtypes = ("bfloat16", "float16", "float32")
    preferred_attention_backends = ("flashinfer", "flash_attn", "triton")
    distributed_backend = "nccl"
    ray_resource = "GPU"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        # device_count() asks NVML or the runtime without creating a CUDA context.
        try:
            if not torch.backends.cuda.is_built():
                return "torch was built without CUDA"
            if torch.cuda.device_count() == 0 or not torch.cuda.is_available():
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                return "no CUDA device visible" + (
                    f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
                )
        except Exception as exc:  # a broken driver must not break platform="auto"
            return f"CUDA probe failed: {type(exc).__name__}: {exc}"
        return None

    def __init__(self, device_index: int | None = None) -> None:
        """Drive GPU ``device_index`` and make it current. Default: in a tensor-parallel worker the
        rank's GPU (``cuda:<local rank>``, so NCCL sees one device per rank), else torch's current
        device (0 unless set)."""
        if device_index is None:
            device_index = distributed.local_rank() if distributed.is_worker() else torch.cuda.current_device()
        self.index = device_index
        torch.cuda.set_device(self.index)
        self.major, self.minor = torch.cuda.get_device_capability(self.index)
        self.supported_dtypes = sm.supported_dtypes(self.major, self.minor)

    def device(self) -> torch.device:
        return torch.device("cuda", self.index)

    def default_dtype(self) -> str:
        return sm.default_dtype(self.major, self.minor)[0]

    def default_dtype_reason(self) -> str:
        return sm.default_dtype(self.major, self.minor)[1]

    def capability(self) -> DeviceCapability:
        return DeviceCapability(
            name=torch.cuda.get_device_name(self.index),
            major=self.major,
            minor=self.minor,
            features=sm.features(self.major, self.minor),
        )

    def profile_peak_memory(self, fn: Callable[[], object]) -> int:
        torch.cuda.synchronize(self.index)
        torch.cuda.reset_peak_memory_stats(self.index)
        before = torch.cuda.memory_allocated(self.index)
        fn()
        torch.cuda.synchronize(self.index)
        peak = torch.cuda.max_memory_allocated(self.index) - before
        return max(int(peak), 0)

    def kv_cache_memory_bytes(self, peak_activation_bytes: int, fraction: float | None) -> int:
        # Blocks torch's allocator caches but no tensor uses (the profiled activations, a throwaway
        # cache) go back to the driver first, so they count as free once, not as used.
        torch.cuda.empty_cache()
        free, _total = torch.cuda.mem_get_info(self.index)
        share = KV_CACHE_MEMORY_FRACTION if fraction is None else fraction
        return max(int((free - peak_activation_bytes) * share), 0)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.index)

    def seed_everything(self, seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    def linear_kernel(self) -> LinearKernel | None:
        # GGUF layers only (dense ones stay on cuBLAS); triton loads when one asks for its ggml_types
        from kvserve_platform_cuda.ggml.kernel import TritonGGMLKernel

        return TritonGGMLKernel()

    def lora_kernel(self) -> LoRAKernel | None:
        # triton loads here, not with the platform: only an engine with enable_lora needs it
        try:
            from kvserve_platform_cuda.lora.kernel import TritonLoRAKernel
        except ModuleNotFoundError as exc:
            if exc.name != "triton":
                raise
            logger.warning("triton is not installed (it has no wheel for this system): LoRA runs core's PyTorch kernel")
            return None
        return TritonLoRAKernel()
