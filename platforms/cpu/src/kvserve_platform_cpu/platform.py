"""The CPU platform: always available; bfloat16 where the CPU multiplies it natively, else float32."""

from __future__ import annotations

import random
from collections.abc import Callable

import psutil
import torch

from kvserve.interfaces import DeviceCapability, LayerOps, LinearKernel, LoRAKernel, Platform, SamplingKernel
from kvserve_cpu_native import cpu_name_and_flags
from kvserve_platform_cpu.cpu_info import native_bf16_feature

# Without an explicit fraction the KV cache takes this share of available memory, capped,
# so a laptop user is not surprised by a multi-GiB allocation.
KV_CACHE_MEMORY_FRACTION = 0.25
KV_CACHE_MEMORY_CAP = 4 << 30


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    supported_dtypes = ("float32", "bfloat16", "float16")
    preferred_attention_backends = ("cpu",)
    distributed_backend = "gloo"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    def device(self) -> torch.device:
        return torch.device("cpu")

    def default_dtype(self) -> str:
        # As vLLM's CPU build: bfloat16 halves memory traffic, but without native bf16 matmul
        # it is emulated and slower than float32.
        return "bfloat16" if native_bf16_feature(cpu_name_and_flags()[1]) else "float32"

    def default_dtype_reason(self) -> str:
        feature = native_bf16_feature(cpu_name_and_flags()[1])
        return f"CPU has {feature}" if feature else "CPU has no native bfloat16 matmul (AMX-BF16, AVX512-BF16)"

    def capability(self) -> DeviceCapability:
        name, flags = cpu_name_and_flags()
        return DeviceCapability(name=name, features=flags)

    def profile_peak_memory(self, fn: Callable[[], object]) -> int:
        """0 without running ``fn``: next to host memory the activation peak is small (the budget is
        a capped share of what is free), and a full-batch forward would cost seconds of start-up."""
        return 0

    def kv_cache_memory_bytes(self, peak_activation_bytes: int, fraction: float | None) -> int:
        free = max(psutil.virtual_memory().available - peak_activation_bytes, 0)
        if fraction is None:
            return int(min(free * KV_CACHE_MEMORY_FRACTION, KV_CACHE_MEMORY_CAP))
        return int(free * fraction)

    def synchronize(self) -> None:
        """CPU ops complete before they return."""

    def seed_everything(self, seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)

    def linear_kernel(self) -> LinearKernel | None:
        """The C++ GEMM (AVX-512 or AVX2) where it runs the dtype (built on first use), else oneDNN
        on prepacked weights (float32, and bfloat16 where the CPU has it natively)."""
        from kvserve_platform_cpu.native_linear import native_linear_kernel
        from kvserve_platform_cpu.onednn_linear import onednn_linear_kernel

        return native_linear_kernel(fallback=onednn_linear_kernel())

    def layer_ops(self) -> LayerOps | None:
        """Fused C++ RMSNorm, add+RMSNorm, SiLU-and-mul and rotary, built on first use; PyTorch's
        (saying why) where they cannot be built."""
        from kvserve_platform_cpu.native_layer_ops import cpu_layer_ops

        return cpu_layer_ops()

    def lora_kernel(self) -> LoRAKernel | None:
        """The C++ SGMV/BGMV kernel (AVX512-BF16, AVX-512 or portable; ``KVSERVE_LORA_KERNEL``
        picks), built on first use; core's PyTorch one (saying why) where it cannot be built."""
        from kvserve_platform_cpu.native_lora import cpu_lora_kernel

        return cpu_lora_kernel()

    def sampling_kernel(self) -> SamplingKernel:
        """The fused C++ draw, built on first use; PyTorch's (saying why) where it cannot be built."""
        from kvserve_platform_cpu.native_sampling import cpu_sampling_kernel

        return cpu_sampling_kernel()
