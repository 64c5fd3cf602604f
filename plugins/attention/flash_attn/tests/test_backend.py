"""The flash_attn backend on a machine without flash-attn or CUDA: it installs, lists itself with
the reason it cannot run, and refuses at start with that reason. On CUDA the attention contract runs."""

from __future__ import annotations

import torch

from kvserve.interfaces import AttentionSpec, LayerAttentionSpec
from kvserve.plugins import load_component
from kvserve.testing import AttentionBackendContract
from kvserve.testing.attention_reference import make_paged_case
from kvserve.testing.optional_backend import OptionalLibraryBackendChecks
from kvserve_attention_flash_attn.library import FLASH_ATTN
from kvserve_platform_cpu.platform import CpuPlatform


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


class TestWithoutFlashAttn(OptionalLibraryBackendChecks):
    """Listed, refused and failing at start with the library's reason where it is missing."""

    backend = "flash_attn"
    distribution = "kvserve-attention-flash-attn"
    library = FLASH_ATTN
    other_platform = "cpu"  # the library's kernels run on CUDA only
    model_type = "llama"

    def test_the_reason_says_what_to_install(self):
        assert self.missing() == "flash-attn is not installed (pip install kvserve-attention-flash-attn[gpu])"


class TestFlashAttnContract(AttentionBackendContract):
    """Runs on a CUDA platform only (skipped elsewhere, saying so)."""

    backend = "flash_attn"
    dtypes = ("float16", "bfloat16")
