"""The CPU platform's C++ LoRA kernel on each path this machine builds, against the dense float64
reference (:func:`kvserve.testing.lora_reference.check_lora_kernel`): segments of every length on
either side of the register tiles, empty segments, several slots, packed
slices, decode rows grouped by adapter, odd ranks and features, base rows left exactly as they were."""

from __future__ import annotations

import pytest
import torch

from kvserve.lora.layers import plan_lora_batch
from kvserve.lora.torch_kernel import TorchLoRAKernel
from kvserve.testing.lora_reference import check_lora_kernel
from kvserve_cpu_native import build_failure_reason
from kvserve_platform_cpu.native_lora import KERNEL_ENV, LIBRARY, NativeLoRAKernel, cpu_lora_kernel
from kvserve_platform_cpu.platform import CpuPlatform

pytestmark = pytest.mark.skipif(build_failure_reason() is not None, reason=f"no native build: {build_failure_reason()}")

DTYPES = [torch.float32, torch.bfloat16]


def built_paths() -> list[str]:
    """The paths this machine's build runs (the kernel is built here, at collection)."""
    kernel = cpu_lora_kernel()
    return kernel.paths if isinstance(kernel, NativeLoRAKernel) else []


PATHS = built_paths()


def test_the_build_runs_the_isa_paths_the_cpu_has():
    assert PATHS[-1] == "portable"
    if torch.cpu._is_avx512_bf16_supported():
        assert PATHS == ["avx512-bf16", "avx512", "portable"]
    if torch.backends.cpu.get_cpu_capability() == "AVX512":
        assert "avx512" in PATHS


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_segments_of_every_length(path, dtype):
    """Lengths 1-40 cross the 8/4/2/1-row tiles; the contract's slices, wider ones (more than one
    48-column block) and an odd rank and input (bfloat16 pairs with a lone k)."""
    kernel = NativeLoRAKernel(path)
    check = check_lora_kernel(kernel, torch.device("cpu"), dtype, seed=1, lengths=range(1, 41))
    assert check.segment_lengths[0] == 0 and check.segment_lengths[-1] >= 33
    check_lora_kernel(kernel, torch.device("cpu"), dtype, seed=2, rank=7, in_features=47, widths=(100, 17, 1))
    check_lora_kernel(kernel, torch.device("cpu"), dtype, seed=3, lengths=[1] * 64, rank=16, widths=(96,))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_rows_of_one_adapter_are_one_item_and_match_the_torch_kernel(path, dtype):
    """40 decode rows alternating two adapters, base rows between: each adapter's rows become one
    BGMV item (of rows that are not consecutive), the result as core's kernel's; the one-pass
    add_lora_linear bit for bit as shrink then expand (h rounded to the dtype in between)."""
    slots = torch.tensor([0, -1, 3, 0, 3, -1, 0, 3] * 5).numpy()
    batch = plan_lora_batch(slots, torch.device("cpu"))
    kernel = NativeLoRAKernel(path)
    rows, items = kernel._rows_and_items(batch)
    assert sorted(items[:, 2].tolist()) == [0, 3] and int((items[:, 1] - items[:, 0]).sum()) == len(rows) == 30
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(len(slots), 64, generator=gen).to(dtype)
    lora_a = (torch.randn(4, 64, 32, generator=gen) / 8).to(dtype)
    lora_b = [(torch.randn(4, 16, w, generator=gen) / 4).to(dtype) for w in (64, 32)]
    y = torch.randn(len(slots), 96, generator=gen).to(dtype)
    expected = y.clone()
    reference = TorchLoRAKernel()
    reference.expand(expected, reference.shrink(x, lora_a, batch), lora_b, batch)
    fused = y.clone()
    kernel.expand(y, kernel.shrink(x, lora_a, batch), lora_b, batch)
    torch.testing.assert_close(y, expected, **({} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 2e-2}))
    kernel.add_lora_linear(fused, x, lora_a, lora_b, batch)
    assert torch.equal(fused, y), "the one-pass op rounds differently from shrink then expand"


def test_float16_runs_on_the_torch_kernel():
    check_lora_kernel(NativeLoRAKernel(), torch.device("cpu"), torch.float16, seed=0)


def test_a_path_the_build_lacks_is_refused():
    with pytest.raises(ValueError, match="not built here"):
        NativeLoRAKernel("avx9000")


def test_the_operators_refuse_mismatched_dtypes_and_plans():
    ops = getattr(torch.ops, LIBRARY)
    x, a = torch.randn(4, 8), torch.randn(2, 8, 4, dtype=torch.bfloat16)
    rows, items = torch.arange(4), torch.tensor([[0, 4, 1]])
    with pytest.raises(RuntimeError, match="lora_a is BFloat16"):
        ops.shrink(x, a, rows, items, "portable")
    with pytest.raises(RuntimeError, match="out of range"):
        ops.shrink(x, a.float(), rows, torch.tensor([[0, 4, 2]]), "portable")
    with pytest.raises(RuntimeError, match="outside the 4 tokens"):
        ops.shrink(x, a.float(), torch.tensor([0, 1, 2, 4]), items, "portable")


def test_the_platform_returns_the_kernel_the_environment_names(monkeypatch):
    monkeypatch.setenv(KERNEL_ENV, "torch")
    assert isinstance(CpuPlatform().lora_kernel(), TorchLoRAKernel)
    monkeypatch.setenv(KERNEL_ENV, "portable")
    assert CpuPlatform().lora_kernel().name == "cpu-native-portable"
    monkeypatch.delenv(KERNEL_ENV)
    assert CpuPlatform().lora_kernel().name == f"cpu-native-{PATHS[0]}"


def test_without_a_compiler_core_kernel_runs_and_the_log_says_why(monkeypatch, caplog):
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    monkeypatch.setenv("CXX", "no-such-compiler")
    with caplog.at_level("WARNING", logger="kvserve"):
        kernel = CpuPlatform().lora_kernel()
    assert isinstance(kernel, TorchLoRAKernel)
    assert "native LoRA kernel unavailable" in caplog.text and "no-such-compiler" in caplog.text
