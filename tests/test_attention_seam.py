"""The attention seam end to end: per-layer facts reach the backend the engine builds, and the
KV pool is sized from what that backend and the platform say (bytes per block, workspace,
profiled activation peak)."""

import math
import textwrap

import numpy as np
import pytest

from kvserve import LLM
from kvserve.errors import ConfigError
from kvserve.interfaces import LayerAttentionSpec
from kvserve.plugins import get_plugin_manager
from kvserve.runner.profiling import profile_batch
from kvserve.testing.hf_models import build_tiny_model

PLUGIN = '''
from kvserve import hookimpl
from kvserve_attention_cpu.backend import CpuAttentionBackend
from kvserve_platform_cpu.platform import CpuPlatform


class NoWindowBackend(CpuAttentionBackend):
    """Refuses sliding windows."""

    name = "cpu_no_window"

    @classmethod
    def unsupported_reasons(cls, spec, platform):
        reasons = super().unsupported_reasons(spec, platform)
        if any(layer.sliding_window is not None for layer in spec.layers):
            reasons.append("sliding window not supported")
        return reasons


class WorkspaceBackend(CpuAttentionBackend):
    """Asks for a workspace beside the KV cache."""

    name = "cpu_workspace"
    WORKSPACE = 0

    def workspace_bytes(self):
        return self.WORKSPACE


class ProfiledPlatform(CpuPlatform):
    """Runs the profiling forward and reports a fixed peak; records what the engine passed.
    Prefers the backend without windows."""

    name = "cpu_profiled"
    preferred_attention_backends = ("cpu_no_window", "cpu")
    PEAK = 1 << 20
    BUDGET = 4 << 20
    calls = []

    def profile_peak_memory(self, fn):
        fn()
        self.calls.append("profile")
        return self.PEAK

    def kv_cache_memory_bytes(self, peak_activation_bytes, fraction):
        self.calls.append((peak_activation_bytes, fraction))
        return int((self.BUDGET - peak_activation_bytes) * (fraction or 1.0))


@hookimpl
def register_attention_backends(register):
    register("cpu_no_window", "seam_test_plugins:NoWindowBackend", priority=-20)
    register("cpu_workspace", "seam_test_plugins:WorkspaceBackend", priority=-20)


@hookimpl
def register_platforms(register):
    register("cpu_profiled", "seam_test_plugins:ProfiledPlatform", priority=-20)
'''


@pytest.fixture
def test_plugins(tmp_path, monkeypatch):
    """The backends and platform above, registered as a plugin; rediscovered afterwards."""
    (tmp_path / "seam_test_plugins.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    import seam_test_plugins

    get_plugin_manager.cache_clear()
    get_plugin_manager().add_plugin(seam_test_plugins, "seam_test_plugins", "seam-test-plugins", "0.1")
    yield seam_test_plugins
    monkeypatch.undo()
    get_plugin_manager.cache_clear()


@pytest.fixture(scope="module")
def qwen2_window(tmp_path_factory):
    """Two layers: layer 0 full, layer 1 sliding (window 5), as Qwen2's max_window_layers=1 says."""
    overrides = {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 1}
    return build_tiny_model("qwen2", tmp_path_factory.mktemp("qwen2-window"), **overrides)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def test_per_layer_facts_reach_the_backend(qwen2_window, llama, test_plugins):
    scale = 16**-0.5  # tiny models: hidden 64 over 4 heads
    fields = {"max_model_len": 64, "num_kv_blocks": 16, "platform": "cpu_profiled"}
    backend = LLM(str(qwen2_window), **fields).engine.runner.backend
    # The platform prefers cpu_no_window, which refuses the sliding layer: auto falls back to cpu.
    assert backend.name == "cpu"
    assert backend.spec.layers == (LayerAttentionSpec(scale), LayerAttentionSpec(scale, sliding_window=5))
    assert backend.spec.num_layers == 2 and backend.spec.cache_dtype == backend.spec.dtype
    assert LLM(str(llama), **fields).engine.runner.backend.name == "cpu_no_window"


def test_forcing_a_backend_that_refuses_the_window_names_it(qwen2_window, test_plugins):
    with pytest.raises(ConfigError, match=r"attention_backend: .*cpu_no_window: sliding window not supported"):
        LLM(str(qwen2_window), max_model_len=64, num_kv_blocks=16, attention_backend="cpu_no_window")


def test_a_backend_asking_for_a_workspace_gets_fewer_blocks(llama, test_plugins):
    # Tiny llama: 2 layers, 2 KV heads of 16, float32, block size 16 -> 4 KiB per block and layer.
    block_bytes = 2 * 16 * 2 * 16 * 4 * 2
    budget = 64 * block_bytes

    def num_blocks(backend):
        llm = LLM(str(llama), dtype="float32", max_model_len=64, kv_cache_memory=budget, attention_backend=backend)
        return llm.engine.kv_cache_manager.num_blocks

    assert num_blocks("cpu") == 64  # the budget pays for the null block too
    test_plugins.WorkspaceBackend.WORKSPACE = 10 * block_bytes
    assert num_blocks("cpu_workspace") == 64 - 10
    test_plugins.WorkspaceBackend.WORKSPACE = 10 * block_bytes + 1  # a partial block costs a whole one
    assert num_blocks("cpu_workspace") == 64 - 11
    test_plugins.WorkspaceBackend.WORKSPACE = budget - 2 * block_bytes
    with pytest.raises(ConfigError, match=r"kv_cache_memory: 1 KV blocks .* bytes of cpu_workspace workspace aside"):
        num_blocks("cpu_workspace")


def test_the_platform_budget_follows_a_profiling_forward(llama, test_plugins):
    platform = test_plugins.ProfiledPlatform
    platform.calls.clear()
    llm = LLM(str(llama), dtype="float32", max_model_len=64, platform="cpu_profiled", max_num_batched_tokens=100)
    fraction = LLM(str(llama), dtype="float32", max_model_len=64, platform="cpu_profiled", kv_cache_memory_fraction=0.5)
    assert platform.calls == ["profile", (platform.PEAK, None), "profile", (platform.PEAK, 0.5)]
    block_bytes = 2 * 16 * 2 * 16 * 4 * 2
    assert llm.engine.kv_cache_manager.num_blocks == (platform.BUDGET - platform.PEAK) // block_bytes
    assert fraction.engine.kv_cache_manager.num_blocks == (platform.BUDGET - platform.PEAK) // 2 // block_bytes
    # An explicit budget or block count needs no profiling.
    LLM(str(llama), max_model_len=64, platform="cpu_profiled", kv_cache_memory=1 << 20)
    LLM(str(llama), max_model_len=64, platform="cpu_profiled", num_kv_blocks=8)
    assert len(platform.calls) == 4


def test_the_profiling_batch_is_the_costliest_step_the_scheduler_can_plan():
    input_ids, positions, batch, num_blocks = profile_batch(100, 64, 8, 16, "cpu")
    assert batch.query_lens_host == [64, 36] and batch.seq_lens_host == [64, 64]
    assert batch.context_lens_host == [0, 28] and batch.context_lens.tolist() == [0, 28]
    assert num_blocks == 1 + 2 * math.ceil(64 / 16)
    assert np.array_equal(batch.block_tables_host, batch.block_tables.numpy()) and 0 not in batch.block_tables_host
    assert positions.tolist() == list(range(64)) + list(range(28, 64)) and len(input_ids) == 100
    slots = batch.slot_mapping.tolist()
    assert len(set(slots)) == 100 and slots[64] == batch.block_tables_host[1][28 // 16] * 16 + 28 % 16
    # Never more sequences than max_num_seqs, nor more tokens than they hold.
    assert profile_batch(1000, 64, 3, 16, "cpu")[2].query_lens_host == [64, 64, 64]


def test_kv_cache_memory_fraction_is_validated():
    with pytest.raises(ConfigError, match="kv_cache_memory_fraction"):
        LLM(kv_cache_memory_fraction=1.5)
