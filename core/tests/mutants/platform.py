"""Deliberately broken copies of the CPU platform: each breaks one rule of the platform contract.

Test fixtures for ``core/tests/test_platform_contract_mutants.py``, which asserts that the
platform contract fails each of them with a message naming the broken behaviour.
"""

from __future__ import annotations

import dataclasses

import psutil
import torch
import torch.nn.functional as F

from kvserve.interfaces import DeviceCapability, LinearKernel, LoRAKernel, SamplingKernel
from kvserve.lora.torch_kernel import TorchLoRAKernel
from kvserve.sampling.torch_kernel import TorchSamplingKernel
from kvserve_platform_cpu.platform import CpuPlatform


class UnsupportedDefault(CpuPlatform):
    """``dtype="auto"`` picks a dtype the platform does not list."""

    name = "cpu_unsupported_default"

    def default_dtype(self) -> str:
        return "float64"


class ForgetsFreedMemory(CpuPlatform):
    """Measures the resident set after the function: activations freed inside it go unseen."""

    name = "cpu_forgets_freed_memory"

    def profile_peak_memory(self, fn) -> int:
        before = psutil.Process().memory_info().rss
        fn()
        return max(psutil.Process().memory_info().rss - before, 0)


class BudgetGrowsWithActivations(CpuPlatform):
    """Adds the activation peak to the KV budget instead of setting it aside."""

    name = "cpu_budget_grows"

    def kv_cache_memory_bytes(self, peak_activation_bytes: int, fraction: float | None) -> int:
        return super().kv_cache_memory_bytes(0, fraction) + peak_activation_bytes


class HalfVersionedCapability(CpuPlatform):
    """Reports an architecture major version without its minor."""

    name = "cpu_half_versioned"

    def capability(self) -> DeviceCapability:
        return DeviceCapability(name="cpu", major=8, minor=None)


class _IgnoresMinP(TorchSamplingKernel):
    def draw(self, logits, temperature, min_p, top_p, uniform):
        return super().draw(logits, temperature, torch.zeros_like(min_p), top_p, uniform)


class SamplerIgnoresMinP(CpuPlatform):
    """The sampling kernel draws from the whole distribution: min-p's floor is never applied."""

    name = "cpu_sampler_ignores_min_p"

    def sampling_kernel(self) -> SamplingKernel:
        return _IgnoresMinP()


class _EveryTokenInTheNucleus(TorchSamplingKernel):
    def draw(self, logits, temperature, min_p, top_p, uniform):
        tokens, _ = super().draw(logits, temperature, min_p, top_p, uniform)
        return tokens, torch.ones_like(tokens, dtype=torch.bool)


class SamplerKeepsEveryToken(CpuPlatform):
    """The sampling kernel says every draw is inside its top-p nucleus: top-p never truncates."""

    name = "cpu_sampler_keeps_every_token"

    def sampling_kernel(self) -> SamplingKernel:
        return _EveryTokenInTheNucleus()


class _SegmentsLoseTheirLastToken(TorchLoRAKernel):
    def expand(self, y, h, lora_b, batch):
        shortened = tuple((start, max(start, stop - 1), slot) for start, stop, slot in batch.segments)
        super().expand(y, h, lora_b, dataclasses.replace(batch, segments=shortened))


class LoRAPrefillLosesLastToken(CpuPlatform):
    """The LoRA kernel's segments stop a token short: the last token of every prefill chunk runs the base model."""

    name = "cpu_lora_prefill_loses_last_token"

    def lora_kernel(self) -> LoRAKernel:
        return _SegmentsLoseTheirLastToken()


class _DecodeRowsShareOneAdapter(TorchLoRAKernel):
    def expand(self, y, h, lora_b, batch):
        slots = batch.single_slots[:1].expand_as(batch.single_slots)
        super().expand(y, h, lora_b, dataclasses.replace(batch, single_slots=slots))


class LoRADecodeRowsShareOneAdapter(CpuPlatform):
    """The LoRA kernel's batched decode rows all take the first row's adapter."""

    name = "cpu_lora_decode_rows_share_one_adapter"

    def lora_kernel(self) -> LoRAKernel:
        return _DecodeRowsShareOneAdapter()


class _DenseLinear(LinearKernel):
    """F.linear on an unchanged copy of the weight: the linear-kernel mutants' sound part."""

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.clone()

    def apply(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, packed, bias)


class _GatedSwapsGateAndUp(_DenseLinear):
    """F.linear, and a gated call that takes the activation of up and multiplies it by gate."""

    name = "swapped-gated"

    def fuses_gated(self, activation: str, packed: torch.Tensor) -> bool:
        return activation == "silu"

    def apply_gated(self, x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
        return F.silu(F.linear(x, up)) * F.linear(x, gate)


class GatedProductSwapsGateAndUp(CpuPlatform):
    """Its linear kernel's fused gated MLP applies SiLU to the wrong projection."""

    name = "cpu_gated_swapped"

    def linear_kernel(self) -> LinearKernel:
        return _GatedSwapsGateAndUp()


class _LogitsSkipTheRounding(_DenseLinear):
    """F.linear, and logits multiplied in float32 from the start: not the product in x's dtype, widened."""

    name = "unrounded-logits"

    def apply_logits(self, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), packed.float())


class LogitsSkipTheRounding(CpuPlatform):
    """Its linear kernel's logits are not its product widened: bfloat16 ones are never rounded."""

    name = "cpu_logits_unrounded"

    def linear_kernel(self) -> LinearKernel:
        return _LogitsSkipTheRounding()
