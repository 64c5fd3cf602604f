"""The flashinfer backend on a machine without FlashInfer or CUDA: it installs, lists itself with
the reason it cannot run, and refuses at start with that reason. On CUDA the attention contract runs."""

from __future__ import annotations

import torch

from kvserve.interfaces import AttentionSpec, LayerAttentionSpec
from kvserve.plugins import load_component
from kvserve.testing import AttentionBackendContract
from kvserve.testing.attention_reference import make_paged_case
from kvserve.testing.optional_backend import OptionalLibraryBackendChecks
from kvserve_attention_flashinfer.backend import WORKSPACE_BYTES, FlashInferMetadata
from kvserve_attention_flashinfer.library import FLASHINFER
from kvserve_platform_cpu.platform import CpuPlatform

LOCAL, GLOBAL = LayerAttentionSpec(0.1, sliding_window=512, logits_soft_cap=50.0), LayerAttentionSpec(0.1)


def spec(**changes) -> AttentionSpec:
    fields = dict(
        num_heads=8, num_kv_heads=2, head_dim=128, dtype=torch.float16, block_size=16, device=torch.device("cpu"),
        layers=(LOCAL, GLOBAL, LOCAL),
    )  # fmt: skip
    return AttentionSpec(**(fields | changes))


def test_registered_with_the_facts_of_flashinfer():
    backend = load_component("attention_backend", "flashinfer")
    assert backend.device_types == ("cuda",) and backend.supported_dtypes == ("float16", "bfloat16")
    assert backend.supported_head_sizes == (64, 128, 256)


def test_refusals_name_dtype_head_size_and_kv_dtype():
    backend = load_component("attention_backend", "flashinfer")
    reasons = backend.unsupported_reasons(
        spec(dtype=torch.float32, head_dim=96, kv_cache_dtype=torch.float8_e4m3fn), CpuPlatform()
    )
    text = " | ".join(reasons)
    for words in ("dtype float32 not supported", "head size 96 not supported (supported: 64, 128, 256)",
                  "KV cache dtype float8_e4m3fn not supported"):  # fmt: skip
        assert words in text, text


def test_without_the_library_it_sizes_and_stores_nhd_pages():
    """Sizing and storing K/V run without flashinfer (imported on the first plan); the workspace
    the engine reserves is the one float buffer all wrappers share, allocated with the cache;
    one kind is planned per distinct layer."""
    backend = load_component("attention_backend", "flashinfer")(spec())
    assert backend.kv_cache_shape(7) == (7, 2, 16, 2, 128)
    assert backend.kv_cache_bytes_per_block() == 2 * 16 * 2 * 128 * 2
    assert backend.workspace_bytes() == WORKSPACE_BYTES == 128 * 1024 * 1024
    assert backend._kinds == (LOCAL, GLOBAL) and backend._kind_of_layer == [0, 1, 0]
    case = make_paged_case([(0, 7), (30, 1), (20, 9)], 8, 2, 128, 16, 12, torch.float16, seed=4)
    caches = backend.allocate_kv_cache(12)
    assert len(caches) == 3 and all(c.shape == (12, 2, 16, 2, 128) and c.dtype == torch.float16 for c in caches)
    assert backend._workspace.numel() == WORKSPACE_BYTES and backend._workspace.dtype == torch.uint8
    backend.write_kv(caches[0], case.key, case.value, FlashInferMetadata((), 0, case.batch.slot_mapping))
    k_slots = caches[0][:, 0].reshape(-1, 2, 128)
    assert torch.equal(k_slots[case.batch.slot_mapping], case.key)


class TestWithoutFlashInfer(OptionalLibraryBackendChecks):
    """Listed, refused and failing at start with the library's reason where it is missing."""

    backend = "flashinfer"
    distribution = "kvserve-attention-flashinfer"
    library = FLASHINFER
    other_platform = "cpu"  # the library's kernels run on CUDA only
    model_type = "llama"

    def test_the_reason_says_what_to_install(self):
        assert self.missing() == "flashinfer is not installed (pip install kvserve-attention-flashinfer[gpu])"


class TestFlashInferContract(AttentionBackendContract):
    """Runs on a CUDA platform only (skipped elsewhere, saying so)."""

    backend = "flashinfer"
    dtypes = ("float16", "bfloat16")
