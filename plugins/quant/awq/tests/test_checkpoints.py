"""Real AWQ checkpoints, packed by AutoAWQ's own ``WQLinear_GEMM.from_linear``, through the
engine: greedy tokens and logprobs against HF transformers running the weights AutoAWQ's
``dequantize_gemm`` gives in fp32, resident bytes against the format's, config refusals,
two tensor-parallel ranks against one, and LoRA adapters over the packed base against ``peft``'s
``PeftModel`` over the dequantized one."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from kvserve import LLM
from kvserve.errors import ConfigError, WorkerError
from kvserve.testing.hf_models import build_tiny_model
from kvserve.testing.parallel import greedy_tokens
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


def awq_checkpoint(autoawq, base, out, group_size):
    """``base`` with every projection packed by AutoAWQ, and the HF model of the weights it encodes."""
    shutil.copytree(base, out)
    weights = load_file(base / "model.safetensors")
    reference = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    for name, module in reference.named_modules():
        if not name.endswith(PROJECTIONS):
            continue
        tensors = autoawq.linear_tensors(module, group_size)
        del weights[f"{name}.weight"]
        weights.update({f"{name}.{key}": value for key, value in tensors.items()})
        # In float32 (AutoAWQ's dequantize_gemm follows the scales' dtype; float16 would round).
        scales = tensors["scales"].float()
        dequantized = autoawq.dequantize_gemm(tensors["qweight"], tensors["qzeros"], scales, 4, group_size)
        module.weight.data = dequantized.float().t().contiguous()
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {  # as AutoAWQ's save_quantized writes it
        "quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4, "version": "gemm",
        "modules_to_not_convert": None,
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    return out, reference.eval()


@pytest.mark.parametrize(
    ("group_size", "hidden"), [(32, 64), (64, 64), (128, 128)], ids=["group32", "group64", "group128"]
)
def test_awq_checkpoint_matches_hf(autoawq, tmp_path, group_size, hidden):
    base = build_tiny_model(
        "llama", tmp_path / "base", randomize_vectors=True, hidden_size=hidden, intermediate_size=2 * hidden
    )
    path, reference = awq_checkpoint(autoawq, base, tmp_path / "awq", group_size)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    llm = LLM(str(path), dtype="float32", max_model_len=128, num_kv_blocks=64)
    got = kvserve_greedy(llm, prompt_ids)
    lengths = assert_matches_reference(got, hf_greedy(reference, prompt_ids), logprob_bound=LOGPROB_BOUND)
    print(f"awq group {group_size}: matching greedy tokens per prompt {lengths} of 32")
    resident, stored = linear_bytes(llm.engine.model, path)
    assert abs(resident / stored - 1) <= 0.1, f"resident linear bytes {resident} vs checkpoint {stored}"
    layer = llm.engine.model.model.layers[0].mlp.down_proj
    dense = [n for n, p in layer.named_parameters() if p.is_floating_point() and p.numel() >= layer.input_size * 8]
    assert not dense, f"down_proj holds dense float parameters {dense}: weights must stay packed"


@pytest.mark.parametrize(
    ("field", "value"), [("version", "gemv"), ("bits", 8), ("group_size", 16), ("zero_point", False)]
)
def test_unsupported_awq_config_fails_at_start_naming_the_field(tmp_path, field, value):
    path = build_tiny_model("llama", tmp_path / "base")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "awq", "zero_point": True, "group_size": 32, "bits": 4, "version": "gemm", field: value
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=rf"quantization_config\.{field}: "):
        LLM(str(path), dtype="float32", max_model_len=128, num_kv_blocks=64)


def test_awq_on_two_tensor_parallel_ranks_matches_one(autoawq, tmp_path):
    """Row-parallel o_proj/down_proj take their rank's input rows of ``qweight`` and its groups
    of ``qzeros``/``scales``; column layers their packed output columns."""
    base = build_tiny_model("llama", tmp_path / "base", randomize_vectors=True)  # hidden 64, mlp 128
    path, _ = awq_checkpoint(autoawq, base, tmp_path / "awq", 32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    one = greedy_tokens(path, prompt_ids)
    assert greedy_tokens(path, prompt_ids, tensor_parallel_size=2) == one
    # Group 64: a rank's 32 input features of o_proj would split a group between ranks.
    path, _ = awq_checkpoint(autoawq, base, tmp_path / "awq64", 64)
    with pytest.raises(
        WorkerError,
        match=r"failed to start: ConfigError: quantization_config\.group_size: 64 does not divide this "
        r"tensor-parallel rank's share of the 32 input features of model\.layers\.0\.self_attn\.o_proj",
    ):
        greedy_tokens(path, prompt_ids, tensor_parallel_size=2)


def test_lora_over_awq_matches_peft_over_the_dequantized_model(autoawq, tmp_path):
    """Adapters on every projection, the packed layers' output plus the LoRA term: 32 greedy tokens of
    each adapter and base row identical to PeftModel over the fp32 weights AutoAWQ dequantizes to."""
    base = build_tiny_model("llama", tmp_path / "base", randomize_vectors=True)
    path, reference = awq_checkpoint(autoawq, base, tmp_path / "awq", 32)
    dense = dense_checkpoint(reference, base, tmp_path / "dense")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    llm = LLM(str(path), dtype="float32", max_model_len=128, num_kv_blocks=64, enable_lora=True, max_loras=2)
    assert_lora_matches_peft(llm, dense, prompt_ids, tmp_path / "adapters", logprob_bound=LOGPROB_BOUND)
    assert llm.engine.model.model.layers[0].mlp.down_proj.qweight.dtype == torch.int32, "the base stays packed"
