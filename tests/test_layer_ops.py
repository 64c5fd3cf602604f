"""The layer-ops seam end to end: at -O0 the engine gives every norm, activation and rope layer the
CPU platform's fused ops and says so on its start-up line; where they cannot be built, core's
PyTorch ops run and the line says why."""

from __future__ import annotations

import pytest

from kvserve import LLM, SamplingParams
from kvserve.layers import LayerOpsModule, TorchLayerOps
from kvserve.testing.hf_models import build_tiny_model
from kvserve_cpu_native import build_failure_reason
from kvserve_platform_cpu.native_layer_ops import NativeLayerOps


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("llama"))


@pytest.mark.skipif(build_failure_reason() is not None, reason=f"no native build: {build_failure_reason()}")
def test_the_engine_runs_the_native_ops_and_says_so(llama_path, startup_lines):
    llm = LLM(str(llama_path), dtype="float32", max_model_len=64, num_kv_blocks=16)
    modules = [m for m in llm.engine.model.modules() if isinstance(m, LayerOpsModule)]
    assert modules and all(isinstance(m.ops, NativeLayerOps) for m in modules)
    line = next(m for m in startup_lines if m.startswith("kvserve engine:"))
    assert "layer_ops=cpu-native (rms_norm, fused_add_rms_norm, silu_and_mul, rotary_embedding)" in line


def test_without_a_compiler_pytorch_ops_run_and_the_line_says_why(llama_path, monkeypatch, startup_lines):
    # The build tools are checked on every engine's start, even with the ops already loaded here.
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    llm = LLM(str(llama_path), dtype="float32", max_model_len=64, num_kv_blocks=16)
    modules = [m for m in llm.engine.model.modules() if isinstance(m, LayerOpsModule)]
    assert modules and all(type(m.ops) is TorchLayerOps for m in modules)
    line = next(m for m in startup_lines if m.startswith("kvserve engine:"))
    assert "layer_ops=torch (native layer ops unavailable: cannot build kvserve_cpu_layer_ops: no C++ compiler" in line
    assert "no-such-compiler-here" in line
    tokens = (
        llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)[0]
        .outputs[0]
        .token_ids
    )
    assert len(tokens) == 4
