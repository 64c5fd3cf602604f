"""The sampling-kernel seam end to end: the engine samples through the CPU platform's fused C++ draw
and says so on its start-up line; where it cannot be built, core's PyTorch kernel runs and the line
says why."""

from __future__ import annotations

import pytest

from kvserve import LLM, SamplingParams
from kvserve.sampling.torch_kernel import TorchSamplingKernel
from kvserve.testing.hf_models import build_tiny_model
from kvserve_cpu_native import build_failure_reason
from kvserve_platform_cpu.native_sampling import NativeSamplingKernel

SAMPLED = SamplingParams(temperature=0.7, top_p=0.9, min_p=0.01, seed=3, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def generate(llm: LLM, params: SamplingParams) -> list[int]:
    return llm.generate([[1, 2, 3]], params, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.skipif(build_failure_reason() is not None, reason=f"no native build: {build_failure_reason()}")
def test_the_engine_samples_through_the_native_kernel_and_says_so(llama_path, startup_lines):
    llm = LLM(str(llama_path), dtype="float32", max_model_len=64, num_kv_blocks=16)
    assert isinstance(llm.engine.sampler.kernel, NativeSamplingKernel)
    line = next(m for m in startup_lines if m.startswith("kvserve engine:"))
    assert "sampling_kernel=cpu-native" in line
    first, again = generate(llm, SAMPLED), generate(llm, SAMPLED)
    assert len(first) == 12 and first == again  # a seeded request repeats itself


def test_without_a_compiler_the_pytorch_kernel_samples_and_the_line_says_why(llama_path, monkeypatch, startup_lines):
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    llm = LLM(str(llama_path), dtype="float32", max_model_len=64, num_kv_blocks=16)
    assert type(llm.engine.sampler.kernel) is TorchSamplingKernel
    line = next(m for m in startup_lines if m.startswith("kvserve engine:"))
    assert "sampling_kernel=torch (native sampling kernel unavailable: cannot build kvserve_cpu_sampling" in line
    assert "no-such-compiler-here" in line
    assert len(generate(llm, SAMPLED)) == 12
