"""Platform choice end to end: the CUDA platform's reason on machines without it, the start-up line's dtype."""

import os
import subprocess
import sys

import pytest
import torch

from kvserve import LLM, components
from kvserve.errors import ConfigError
from kvserve.testing.hf_models import build_tiny_model
from kvserve_platform_cpu.platform import CpuPlatform

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is visible: the platform is available")
WHY = "torch was built without CUDA" if not torch.backends.cuda.is_built() else "no CUDA device visible"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("platforms"))


@no_cuda
def test_plugins_listing_says_cuda_is_unavailable_and_why():
    env = {**os.environ, "COLUMNS": "250"}
    out = subprocess.run([sys.executable, "-m", "kvserve.cli", "plugins"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if "kvserve-platform-cuda" in line)
    assert "cuda" in row and f"unavailable: {WHY}" in row
    cpu_row = next(line for line in out.stdout.splitlines() if "kvserve-platform-cpu" in line)
    assert " ok " in cpu_row


@no_cuda
def test_llm_on_cuda_fails_at_start_with_the_reason(model_path):
    with pytest.raises(ConfigError, match=f"^platform: no usable platform \\(cuda: {WHY}"):
        LLM(str(model_path), platform="cuda", max_model_len=64, num_kv_blocks=16)


def test_startup_line_says_the_dtype_and_why(model_path, startup_lines):
    llm = LLM(str(model_path), platform="cpu", max_model_len=64, num_kv_blocks=16)
    platform = CpuPlatform()
    line = next(m for m in startup_lines if m.startswith("kvserve engine:"))
    assert f"dtype={platform.default_dtype()} (auto: {platform.default_dtype_reason()})" in line
    assert llm.engine.dtype == getattr(torch, platform.default_dtype())

    startup_lines.clear()
    LLM(str(model_path), dtype="float32", max_model_len=64, num_kv_blocks=16)
    assert "dtype=float32 (configured)" in next(m for m in startup_lines if m.startswith("kvserve engine:"))


def test_auto_passes_over_a_platform_no_installed_backend_runs_on():
    """A GPU machine with only CPU attention installed runs on the CPU under platform="auto"."""

    class Elsewhere(CpuPlatform):
        device_type = "meta"

    assert components.unserved_reason(CpuPlatform) is None
    assert components.unserved_reason(Elsewhere) == "no installed attention backend runs on 'meta' devices"
