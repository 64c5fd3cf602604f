"""The flash_attn backend on a machine without flash-attn or CUDA: it installs, lists itself with
the reason it cannot run, and refuses at start with that reason. On CUDA the attention contract runs."""

from __future__ import annotations

import pytest
import torch

from kvserve import LLM
from kvserve.errors import ConfigError
from kvserve.interfaces import AttentionSpec, LayerAttentionSpec
from kvserve.plugins import load_component
from kvserve.testing import AttentionBackendContract
from kvserve.testing.attention_reference import make_paged_case
from kvserve.testing.hf_models import build_tiny_model
from kvserve_attention_flash_attn.library import missing_reason
from kvserve_platform_cpu.platform import CpuPlatform

NO_FLASH_ATTN = missing_reason()


def spec(**changes) -> AttentionSpec:
    fields = dict(
        num_heads=8, num_kv_heads=2, head_dim=128, dtype=torch.float16, block_size=256, device=torch.device("cpu"),
        layers=(LayerAttentionSpec(0.1), LayerAttentionSpec(0.1, sliding_window=512, logits_soft_cap=50.0)),
    )  # fmt: skip
    return AttentionSpec(**(fields | changes))


def test_registered_with_the_facts_of_flash_attention_2():
    backend = load_component("attention_backend", "flash_attn")
    assert backend.device_types == ("cuda",) and backend.supported_dtypes == ("float16", "bfloat16")
    assert backend.block_size_multiple == 256 == backend.default_block_size


@pytest.mark.skipif(NO_FLASH_ATTN is None, reason="flash-attn is installed here")
def test_cpu_refusal_names_the_platform_and_the_missing_library():
    backend = load_component("attention_backend", "flash_attn")
    reasons = backend.unsupported_reasons(spec(), CpuPlatform())
    assert "platform 'cpu' not supported (runs on: cuda)" in reasons
    assert "flash-attn is not installed (pip install kvserve-attention-flash-attn[gpu])" in reasons


def test_refusals_name_block_size_dtype_head_size_and_kv_dtype():
    backend = load_component("attention_backend", "flash_attn")
    reasons = backend.unsupported_reasons(
        spec(block_size=16, dtype=torch.float32, head_dim=100, kv_cache_dtype=torch.float8_e4m3fn), CpuPlatform()
    )
    text = " | ".join(reasons)
    for words in ("block size 16 is not a multiple of 256", "dtype float32 not supported", "head size 100",
                  "KV cache dtype float8_e4m3fn not supported"):  # fmt: skip
        assert words in text, text


def test_without_the_library_it_sizes_plans_and_stores_on_the_host():
    """Everything but the kernel call runs without flash-attn: the import waits for the first forward."""
    backend = load_component("attention_backend", "flash_attn")(spec())
    assert backend.kv_cache_shape(7) == (2, 7, 256, 2, 128)
    assert backend.kv_cache_bytes_per_block() == 2 * 256 * 2 * 128 * 2
    case = make_paged_case([(0, 7), (300, 1), (20, 9)], 8, 2, 128, 256, 8, torch.float16, seed=4)
    (cache, _) = backend.allocate_kv_cache(8)
    metadata = backend.build_metadata(case.batch)
    backend.write_kv(cache, case.key, case.value, metadata)
    slots = case.batch.slot_mapping
    assert torch.equal(cache[0].view(-1, 2, 128)[slots], case.key)
    assert torch.equal(cache[1].view(-1, 2, 128)[slots], case.value)
    assert not metadata.decode_only and metadata.cu_seqlens_k.tolist() == [0, 7, 308, 337]


@pytest.mark.skipif(NO_FLASH_ATTN is None, reason="flash-attn is installed here")
def test_forcing_it_on_cpu_fails_at_start_with_the_reason(tmp_path):
    path = build_tiny_model("llama", tmp_path)
    with pytest.raises(ConfigError, match=r"flash_attn: .*flash-attn is not installed \(pip install"):
        LLM(str(path), attention_backend="flash_attn", max_model_len=64, num_kv_blocks=8)


class TestFlashAttnContract(AttentionBackendContract):
    """Runs on a CUDA platform only (skipped elsewhere, saying so)."""

    backend = "flash_attn"
    dtypes = ("float16", "bfloat16")
