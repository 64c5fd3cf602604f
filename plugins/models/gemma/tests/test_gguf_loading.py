"""Gemma GGUF weights through ``kvserve.loader``: names, llama.cpp's ``1 + weight`` norm gains, rope scaling.

A tiny HF Gemma 3 (or Gemma 2) checkpoint is written as a GGUF the way llama.cpp's converter does (gguf's own
HF→GGUF name map, ``+1`` added to every ``*norm.weight``, the global layers' linear rope scaling
as ``gemma3.rope.scaling.*``); reading it back must give the HF tensors, and the config read
from the GGUF metadata must build a model computing HF's logits.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import transformers

from kvserve.layers import UnquantizedLinearMethod
from kvserve.loader import open_model
from kvserve.testing.hf_models import build_tiny_model
from kvserve_models_gemma import model as gemma

# Six layers: the GGUF carries no layer pattern, so both sides use the default (Gemma 3: 5 local, 1 global).
TINY = {"num_hidden_layers": 6, "head_dim": 32, "randomize_vectors": True}
# As Gemma 3 4B and larger: linear rope scaling on the global layers only.
SCALED_ROPE = {
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
    }
}


GGUF_ARCH = {"gemma3_text": gguf.MODEL_ARCH.GEMMA3, "gemma2": gguf.MODEL_ARCH.GEMMA2}


def write_gemma_gguf(hf_model: transformers.PreTrainedModel, file) -> None:
    """Write ``hf_model`` as an F32 GGUF laid out as llama.cpp's convert_hf_to_gguf.py writes Gemma 3 / 2."""
    config = hf_model.config
    arch = GGUF_ARCH[config.model_type]
    name_map = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    writer = gguf.GGUFWriter(file, gguf.MODEL_ARCH_NAMES[arch])
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    full_rope = config.rope_parameters.get("full_attention", config.rope_parameters)  # Gemma 2: one for all
    writer.add_rope_freq_base(full_rope["rope_theta"])
    if full_rope["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full_rope["factor"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_sliding_window(config.sliding_window)
    writer.add_vocab_size(config.vocab_size)
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied: llama.cpp writes no output.weight
        module_name, _, suffix = name.rpartition(".")
        array = tensor.numpy()
        if name.endswith("norm.weight"):
            array = array + 1.0  # llama.cpp's kernel has no (1 + weight) offset
        writer.add_tensor(f"{name_map.get_name(module_name)}.{suffix}", np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    ("model_type", "overrides"),
    [("gemma3_text", {}), ("gemma3_text", SCALED_ROPE), ("gemma2", {})],
    ids=["gemma3-270m-like", "gemma3-rope-scaled", "gemma2"],
)
def test_gguf_weights_and_config_are_the_hf_ones(tmp_path, paged_sequences, model_type, overrides):
    hf_dir = build_tiny_model(model_type, tmp_path / "hf", **TINY, **overrides)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    file = tmp_path / "gguf" / "tiny.gguf"
    file.parent.mkdir()
    write_gemma_gguf(hf_model, file)

    source = open_model(str(file), tokenizer=str(hf_dir))
    weights = dict(source.weights())
    expected = {name: t for name, t in hf_model.state_dict().items() if name != "lm_head.weight"}
    assert sorted(weights) == sorted(expected)
    for name, tensor in expected.items():
        # float32 (w + 1) - 1 rounds away the lowest bits of small gains.
        torch.testing.assert_close(weights[name], tensor, atol=1e-7, rtol=0, msg=name)

    assert source.hf_config.architectures == hf_model.config.architectures
    assert source.hf_config.layer_types == hf_model.config.layer_types
    assert source.hf_config.rope_parameters == hf_model.config.rope_parameters
    model = getattr(gemma, source.hf_config.architectures[0])(source.hf_config, UnquantizedLinearMethod())
    model.load_weights(weights.items())
    tokens = list(range(3, 40))
    with torch.no_grad():
        expected_logits = hf_model(torch.tensor([tokens])).logits[0]
    logits = paged_sequences(model.eval(), 1).step({0: tokens})[0]
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=0)
