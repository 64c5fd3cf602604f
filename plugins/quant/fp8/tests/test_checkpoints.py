"""Real FP8 checkpoints through the engine: greedy tokens and logprobs against HF transformers
running the dequantized weights in fp32, and the resident weight bytes against the format's.

compressed-tensors checkpoints are made by compressed-tensors itself (its quantization config,
qparams and compressor, as llmcompressor's ``oneshot`` drives them) and read back for the
reference by transformers' own compressed-tensors loader, decompressed to fp32. vLLM-style
``fp8`` checkpoints are written from the published layout (``weight = fp8(w / scale)``,
``scale = amax / 448`` per tensor); their reference is the same dequantized weight in HF.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from kvserve import LLM
from kvserve.testing.hf_models import build_tiny_model
from kvserve.testing.quant_parity import (
    PROMPTS,
    assert_lora_matches_peft,
    assert_matches_reference,
    dense_checkpoint,
    hf_greedy,
    kvserve_greedy,
    linear_bytes,
)

LOGPROB_BOUND = 1e-3
"""Same dequantized weights in fp32 on both sides: only summation order differs."""
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _engine(path, **fields):
    return LLM(str(path), dtype="float32", max_model_len=128, num_kv_blocks=64, **fields)


def _prompt_ids(path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    return [tokenizer.encode(p) for p in PROMPTS]


def _check(path, reference_model, **fields):
    prompt_ids = _prompt_ids(path)
    expected = hf_greedy(reference_model.eval(), prompt_ids)
    llm = _engine(path, **fields)
    lengths = assert_matches_reference(kvserve_greedy(llm, prompt_ids), expected, logprob_bound=LOGPROB_BOUND)
    return llm, lengths


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("fp8-base"), randomize_vectors=True)


def compressed_tensors_checkpoint(base, out, scheme: str, ignore: list[str]):
    """Quantize ``base`` with compressed-tensors' preset ``scheme`` and save it compressed."""
    ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors makes these checkpoints")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    scheme_args = ct.quantization.preset_name_to_scheme(scheme, ["Linear"])
    config = QuantizationConfig(
        config_groups={"group_0": scheme_args}, ignore=ignore, quantization_status=QuantizationStatus.INITIALIZED
    )
    apply_quantization_config(model, config)
    per_channel = str(scheme_args.weights.strategy).endswith("channel")
    for module in model.modules():
        if hasattr(module, "weight_scale"):
            weight = module.weight.data
            low, high = (weight.amin(1, keepdim=True), weight.amax(1, keepdim=True)) if per_channel else (
                weight.amin().reshape(1), weight.amax().reshape(1))  # fmt: skip
            scale, _ = calculate_qparams(low, high, scheme_args.weights)
            module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
            if hasattr(module, "input_scale"):
                module.input_scale.data.fill_(0.05)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    for file in base.glob("tokenizer*"):
        shutil.copy(file, out)
    return out


@pytest.mark.parametrize(
    ("scheme", "ignore"),
    [("FP8_DYNAMIC", ["lm_head", "re:.*down_proj"]), ("FP8", ["lm_head"])],
    ids=["per-channel-dynamic-down-proj-ignored", "per-tensor-static"],
)
def test_compressed_tensors_checkpoint_matches_hf(base, tmp_path, scheme, ignore):
    path = compressed_tensors_checkpoint(base, tmp_path / scheme, scheme, ignore)
    weights = load_file(path / "model.safetensors")
    assert weights["model.layers.0.mlp.up_proj.weight"].dtype == torch.float8_e4m3fn
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=transformers.CompressedTensorsConfig(run_compressed=False)
    )
    llm, lengths = _check(path, reference)
    print(f"compressed-tensors {scheme}: matching greedy tokens per prompt {lengths} of 32")
    model = llm.engine.model
    layer = model.model.layers[0].self_attn.qkv_proj
    assert layer.weight.dtype == torch.float8_e4m3fn, "weights must stay FP8 in memory"
    down = model.model.layers[1].mlp.down_proj
    ignored = weights["model.layers.1.mlp.down_proj.weight"].dtype != torch.float8_e4m3fn
    assert ignored == (down.quant_method.name == "none") == (len(ignore) > 1), "the ignore list was not honoured"
    resident, stored = linear_bytes(model, path)
    assert abs(resident / stored - 1) <= 0.1, f"resident linear bytes {resident} vs checkpoint {stored}"


def test_vllm_style_fp8_checkpoint_matches_hf(base, tmp_path):
    """Per-tensor scales differ across q/k/v (fused: kept as per-row scales on CPU); static input scales."""
    path = tmp_path / "fp8"
    shutil.copytree(base, path)
    weights = load_file(base / "model.safetensors")
    reference = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    state = reference.state_dict()
    for name in list(weights):
        if name.rpartition(".")[0].endswith(PROJECTIONS) and name.endswith(".weight"):
            weight = weights[name].float()
            scale = weight.abs().amax() / 448.0
            fp8 = (weight / scale).to(torch.float8_e4m3fn)
            weights[name] = fp8
            weights[name + "_scale"] = scale.reshape(())
            weights[name.removesuffix("weight") + "input_scale"] = torch.tensor(0.05)
            state[name].copy_(fp8.float() * scale)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    (path / "config.json").write_text(json.dumps(config))
    reference.load_state_dict(state)
    llm, lengths = _check(path, reference)
    print(f"vllm-style fp8: matching greedy tokens per prompt {lengths} of 32")
    resident, stored = linear_bytes(llm.engine.model, path)
    assert abs(resident / stored - 1) <= 0.1, f"resident linear bytes {resident} vs checkpoint {stored}"


def online_fp8_reference(base):
    """HF over ``base`` with the weights rounded through compressed-tensors' per-tensor FP8 fake
    quantization, one scale per kvserve layer (as ``quantization="fp8"`` rounds them)."""
    pytest.importorskip("compressed_tensors", reason="compressed-tensors rounds the reference weights")
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True)
    reference = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    for layer in reference.model.layers:
        # One scale per kvserve layer: q/k/v are fused into one, the others stand alone.
        attn, mlp = layer.self_attn, layer.mlp
        for group in (
            [attn.q_proj, attn.k_proj, attn.v_proj],
            [attn.o_proj],
            [mlp.gate_proj],
            [mlp.up_proj],
            [mlp.down_proj],
        ):
            low = torch.stack([m.weight.data.amin() for m in group]).amin().reshape(1)
            high = torch.stack([m.weight.data.amax() for m in group]).amax().reshape(1)
            scale, zero = calculate_qparams(low, high, args)
            for module in group:
                module.weight.data = fake_quantize(module.weight.data, scale, zero, args)
    return reference.eval()


def test_online_fp8_matches_hf_on_fp8_rounded_weights(base):
    """``quantization="fp8"`` on an fp32 checkpoint: the reference is HF with the weights rounded
    through compressed-tensors' per-tensor FP8 fake quantization, one scale per kvserve layer."""
    reference = online_fp8_reference(base)
    prompt_ids = _prompt_ids(base)
    llm = _engine(base, quantization="fp8")
    lengths = assert_matches_reference(
        kvserve_greedy(llm, prompt_ids), hf_greedy(reference, prompt_ids), logprob_bound=LOGPROB_BOUND
    )
    print(f"online fp8: matching greedy tokens per prompt {lengths} of 32")
    layer = llm.engine.model.model.layers[0].mlp.down_proj
    assert layer.weight.dtype == torch.float8_e4m3fn and layer.weight_scale.dtype == torch.float32


def test_lora_over_online_fp8_matches_peft_over_the_rounded_model(base, tmp_path):
    """Adapters over ``quantization="fp8"``: 32 greedy tokens of each adapter and base row identical to
    PeftModel over the FP8-rounded fp32 weights."""
    dense = dense_checkpoint(online_fp8_reference(base), base, tmp_path / "dense")
    llm = _engine(base, quantization="fp8", enable_lora=True, max_loras=2)
    assert_lora_matches_peft(llm, dense, _prompt_ids(base), tmp_path / "adapters", logprob_bound=LOGPROB_BOUND)
    assert llm.engine.model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn


def test_lora_over_a_compressed_tensors_checkpoint_matches_peft(base, tmp_path):
    """Adapters over a compressed-tensors FP8 checkpoint (per-channel, down_proj left unquantized, so FP8
    and dense layers both take LoRA): 32 greedy tokens identical to PeftModel over the fp32 weights
    transformers decompresses."""
    path = compressed_tensors_checkpoint(base, tmp_path / "ct", "FP8_DYNAMIC", ["lm_head", "re:.*down_proj"])
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, quantization_config=transformers.CompressedTensorsConfig(run_compressed=False)
    )
    dense = dense_checkpoint(reference, base, tmp_path / "dense")
    llm = _engine(path, enable_lora=True, max_loras=2)
    assert_lora_matches_peft(llm, dense, _prompt_ids(path), tmp_path / "adapters", logprob_bound=LOGPROB_BOUND)
    assert llm.engine.model.model.layers[0].mlp.up_proj.weight.dtype == torch.float8_e4m3fn
