"""The example's GGUF mapping: a GPT-2 GGUF written as llama.cpp's converter writes it loads as the HF
checkpoint, and the mapping passes the GGUF architecture contract."""

from __future__ import annotations

import gguf
import numpy as np
import torch
import transformers

from kvserve.loader import open_model
from kvserve.testing import GGUFArchitectureContract
from kvserve.testing.hf_models import build_tiny_model
from kvserve_example_model.gpt2 import CONV1D


class TestGPT2GGUF(GGUFArchitectureContract):
    gguf_architecture = "gpt2"


def write_gpt2_gguf(hf_model: transformers.PreTrainedModel, file) -> None:
    """An F32 GGUF as convert_hf_to_gguf.py writes GPT-2: gguf's name map, Conv1D weights transposed,
    no ``lm_head`` (tied), the vocabulary as the token list (where transformers reads the vocab size)."""
    config = hf_model.config
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, config.n_layer)
    writer = gguf.GGUFWriter(file, "gpt2")
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    writer.add_token_list([f"t{i}" for i in range(config.vocab_size)])
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight":
            continue
        module_name, _, suffix = name.rpartition(".")
        array = tensor.numpy().T if name.endswith(CONV1D) else tensor.numpy()
        writer.add_tensor(f"{name_map.get_name(module_name)}.{suffix}", np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gpt2_gguf_weights_are_the_hf_weights(tmp_path):
    hf_dir = build_tiny_model("GPT2LMHeadModel", tmp_path / "hf")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    file = tmp_path / "gguf" / "tiny.gguf"
    file.parent.mkdir()
    write_gpt2_gguf(hf_model, file)

    source = open_model(str(file), tokenizer=str(hf_dir))
    assert source.hf_config.architectures == ["GPT2LMHeadModel"]
    weights = dict(source.weights())
    expected = {name: tensor for name, tensor in hf_model.state_dict().items() if name != "lm_head.weight"}
    assert sorted(weights) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(weights[name], tensor, atol=0, rtol=0, msg=name)
