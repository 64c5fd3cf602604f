"""The platform's linear kernel seam: the engine repacks every dense linear layer and the LM head
once after loading (the dense weights freed), leaves quantized layers alone, computes the same
products, and says on its start-up line which kernel ran."""

from __future__ import annotations

import gc

import pytest
import torch
from safetensors.torch import load_file
from torch.multiprocessing.reductions import StorageWeakRef

from kvserve import LLM
from kvserve.layers import LinearBase, PackedLinearMethod, UnquantizedLinearMethod, pack_linear_weights
from kvserve.loader import open_model
from kvserve.plugins import load_component
from kvserve.testing.hf_models import build_tiny_model
from kvserve_platform_cpu.platform import CpuPlatform

kernel = CpuPlatform().linear_kernel()
pytestmark = pytest.mark.skipif(kernel is None, reason="the CPU platform offers no linear kernel here")


def packs(dtype: torch.dtype) -> bool:
    """Whether the platform's kernel (or its fallback) takes weights of ``dtype``."""
    return kernel.pack(torch.zeros(8, 8, dtype=dtype)) is not None


@pytest.fixture(scope="module", params=["untied", "tied"])
def model_path(request, tmp_path_factory):
    return build_tiny_model(
        "llama", tmp_path_factory.mktemp(request.param), tie_word_embeddings=request.param == "tied"
    )


def dense_model(path, dtype: torch.dtype) -> torch.nn.Module:
    """The model as loaded before any packing."""
    source = open_model(str(path))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = load_component("model", source.hf_config.architectures[0])(source.hf_config, UnquantizedLinearMethod())
    finally:
        torch.set_default_dtype(previous)
    model.load_weights(source.weights())
    return model.eval()


def test_engine_packs_every_dense_layer_and_the_lm_head(model_path, startup_lines):
    llm = LLM(str(model_path), dtype="float32", max_model_len=64, num_kv_blocks=16)
    model = llm.engine.model
    linears = [m for m in model.modules() if isinstance(m, LinearBase)]
    engine_kernel = linears[0].quant_method.kernel  # the engine's own, of the platform's kind
    assert type(engine_kernel) is type(kernel) and all(
        isinstance(m.quant_method, PackedLinearMethod) and m.quant_method.kernel is engine_kernel for m in linears
    )
    # The packed weight took the dense one's place (in the seam's shape and dtype).
    assert all(m.weight.shape == (m.output_size, m.input_size) and m.weight.dtype == torch.float32 for m in linears)
    head, embedding, config = model.lm_head, model.model.embed_tokens, model.hf_config
    assert head.packed_head is not None and head.packed_head.shape == (config.vocab_size, config.hidden_size)
    if head is embedding:  # tied: the token embedding still reads the dense matrix, as the checkpoint has it
        checkpoint = load_file(model_path / "model.safetensors")
        assert torch.equal(embedding.weight, checkpoint["model.embed_tokens.weight"])
        assert embedding.weight is not head.packed_head
    else:
        assert head.weight.numel() == 0 and embedding.packed_head is None
    # Each MLP's gate, up and SiLU run as one call of the kernel, which fuses SiLU in float32.
    mlps = [layer.mlp for layer in model.model.layers]
    assert all(mlp.gated_kernel is engine_kernel for mlp in mlps)
    line = next(m for m in startup_lines if m.startswith("kvserve engine:"))
    layers = f"{len(linears)}/{len(linears)} linear layers + lm_head; {len(mlps)} gated MLPs fused"
    assert f"linear_kernel={engine_kernel.name} ({layers})" in line


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_layers_compute_what_the_dense_ones_did(model_path, dtype):
    if not packs(dtype):
        pytest.skip(f"the platform's {kernel.name} kernel does not run {dtype} on this CPU")
    dense, packed = dense_model(model_path, dtype), dense_model(model_path, dtype)
    linear_storage = [StorageWeakRef(m.weight.untyped_storage()) for m in packed.modules() if isinstance(m, LinearBase)]
    head_storage = StorageWeakRef(packed.lm_head.weight.untyped_storage())
    tied = packed.lm_head is packed.model.embed_tokens
    report = pack_linear_weights(packed, kernel)
    assert report.packed_layers > 0 and report.dense_layers == 0 and report.lm_head
    # The dense weights were freed; a tied head's stays, for the token embedding.
    gc.collect()
    assert all(ref.expired() for ref in linear_storage)
    assert head_storage.expired() is not tied
    gen = torch.Generator().manual_seed(0)
    tolerance = {} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    layers = dict(packed.named_modules())
    with torch.inference_mode():
        for name, layer in dense.named_modules():
            if isinstance(layer, LinearBase):
                x = torch.randn(5, layer.input_size, generator=gen).to(dtype)
                torch.testing.assert_close(layers[name](x), layer(x), **tolerance, msg=name)
        hidden = torch.randn(3, dense.hf_config.hidden_size, generator=gen).to(dtype)
        torch.testing.assert_close(packed.compute_logits(hidden), dense.compute_logits(hidden), **tolerance)
        # The MLPs through the kernel's gated call, against F.linear's products and PyTorch's SiLU.
        assert report.gated_mlps == len(packed.model.layers)
        for number, layer in enumerate(dense.model.layers):
            assert packed.model.layers[number].mlp.gated_kernel is kernel
            torch.testing.assert_close(packed.model.layers[number].mlp(hidden), layer.mlp(hidden), **tolerance)
        ids = torch.tensor([1, 5, 9])
        torch.testing.assert_close(packed.model.embed_tokens(ids), dense.model.embed_tokens(ids), rtol=0, atol=0)


class SubclassedMethod(UnquantizedLinearMethod):
    """A quantization method of its own (here: dense, under another name) owns its parameters."""

    name = "subclassed"


def test_layers_of_another_method_and_dtypes_the_kernel_declines_stay_dense(model_path):
    model = dense_model(model_path, torch.float32)
    mlp = model.model.layers[0].mlp
    mlp.down_proj.quant_method = SubclassedMethod()
    float16_layer = mlp.up_proj
    float16_layer.weight.data = float16_layer.weight.data.half()
    kept = {"down": mlp.down_proj.weight, "float16": float16_layer.weight}
    kept_values = {key: weight.detach().clone() for key, weight in kept.items()}
    report = pack_linear_weights(model, kernel)
    # Both keep their own parameter, untouched, and their method.
    assert mlp.down_proj.weight is kept["down"] and isinstance(mlp.down_proj.quant_method, SubclassedMethod)
    assert float16_layer.weight is kept["float16"] and type(float16_layer.quant_method) is UnquantizedLinearMethod
    assert all(torch.equal(kept[key], kept_values[key]) for key in kept)
    assert isinstance(mlp.gate_proj.quant_method, PackedLinearMethod)
    assert report.dense_layers == 1 and "linear layers + lm_head" in str(report)
    # Its up projection left dense, that MLP keeps two products and its activation; the others fuse.
    assert mlp.gated_kernel is None and report.gated_mlps == len(model.model.layers) - 1


def test_no_kernel_leaves_f_linear(model_path, monkeypatch, startup_lines):
    monkeypatch.setattr(CpuPlatform, "linear_kernel", lambda self: None)
    llm = LLM(str(model_path), dtype="float32", max_model_len=64, num_kv_blocks=16)
    linears = [m for m in llm.engine.model.modules() if isinstance(m, LinearBase)]
    assert linears and all(type(m.quant_method) is UnquantizedLinearMethod for m in linears)
    assert llm.engine.model.lm_head.packed_head is None
    assert "linear_kernel=F.linear " in next(m for m in startup_lines if m.startswith("kvserve engine:"))
