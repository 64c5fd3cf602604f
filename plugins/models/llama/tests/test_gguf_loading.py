"""GGUF weights through ``kvserve.loader``: names, llama.cpp's q/k row order and tied embeddings.

A tiny HF checkpoint is written as a GGUF the way llama.cpp's converter does (gguf's own
HF→GGUF name map, q/k rows permuted on "llama"); reading it back must give the HF tensors.
transformers' own GGUF reader serves as the independent reference for the file written here.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers

from kvserve.layers import UnquantizedLinearMethod
from kvserve.loader import ModelLoadError, gguf_file, open_model
from kvserve.loader.default_model import embedded_gguf_path
from kvserve.testing.hf_models import build_tiny_model
from kvserve_models_llama import model as llama


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute``: interleave each head's two rotary halves."""
    head_rows = weight.shape[0] // heads
    return weight.reshape(heads, 2, head_rows // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(hf_dir: Path, file: Path) -> dict[str, torch.Tensor]:
    """Write the checkpoint in ``hf_dir`` as an F32 GGUF; returns the HF state dict it holds."""
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    config = hf_model.config
    architecture = config.model_type
    arch = next(key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture)
    name_map = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    writer = gguf.GGUFWriter(file, architecture)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    state = {name: tensor.detach().clone() for name, tensor in hf_model.state_dict().items()}
    if config.tie_word_embeddings:
        del state["lm_head.weight"]  # llama.cpp writes no output.weight for tied models
    for name, tensor in state.items():
        module_name, _, suffix = name.rpartition(".")
        array = tensor.numpy()
        if architecture == "llama" and ".q_proj." in name:
            array = llama_cpp_permute(array, config.num_attention_heads)
        elif architecture == "llama" and ".k_proj." in name:
            array = llama_cpp_permute(array, config.num_key_value_heads)
        writer.add_tensor(f"{name_map.get_name(module_name)}.{suffix}", np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return state


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("llama", {}),
        ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": True}),
        ("qwen2", {}),
        ("qwen3", {"tie_word_embeddings": True}),
    ],
    ids=["llama-gqa", "llama-mha-tied", "qwen2", "qwen3-tied"],
)
def test_gguf_weights_are_the_hf_weights(tmp_path, arch, overrides, paged_sequences):
    hf_dir = build_tiny_model(arch, tmp_path / "hf", **overrides)
    file = tmp_path / "gguf" / "tiny.gguf"
    file.parent.mkdir()
    expected = write_gguf(hf_dir, file)

    source = open_model(str(file), tokenizer=str(hf_dir))
    weights = dict(source.weights())
    assert sorted(weights) == sorted(expected)
    for name, tensor in expected.items():
        assert weights[name].dtype == torch.float32
        torch.testing.assert_close(weights[name], tensor, atol=0, rtol=0, msg=name)
    assert source.tokenizer.get_vocab() == transformers.AutoTokenizer.from_pretrained(hf_dir).get_vocab()

    # The config read from GGUF metadata builds a model that computes what the original does.
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    assert source.hf_config.architectures == hf_model.config.architectures
    model = getattr(llama, source.hf_config.architectures[0])(source.hf_config, UnquantizedLinearMethod())
    model.load_weights(weights.items())
    tokens = list(range(3, 40))
    with torch.no_grad():
        expected_logits = hf_model(torch.tensor([tokens])).logits[0]
    logits = paged_sequences(model, 1).step({0: tokens})[0]
    torch.testing.assert_close(logits, expected_logits, atol=1e-4, rtol=0)


def test_written_gguf_has_llama_cpp_layout(tmp_path):
    """Guards the writer above: transformers' GGUF reader undoes its q/k permutation exactly."""
    hf_dir = build_tiny_model("llama", tmp_path / "hf")
    file = tmp_path / "gguf" / "tiny.gguf"
    file.parent.mkdir()
    expected = write_gguf(hf_dir, file)
    reference = transformers.AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name).state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(reference[name], tensor, atol=0, rtol=0, msg=name)


def test_unsupported_gguf_architecture_is_named(tmp_path):
    file = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(file, "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelLoadError, match="GGUF architecture 'gpt2' is not supported") as error:
        open_model(str(file))
    # It says which architectures the installed model plugins read, and from which package.
    assert "llama (kvserve-models-llama)" in str(error.value)
    assert "gemma3 (kvserve-models-gemma)" in str(error.value)
    assert "register_gguf_architectures" in str(error.value)


def test_a_gguf_is_parsed_once(monkeypatch):
    """``open_model`` parses a GGUF's header once (``kvserve.loader.gguf_file``) for its config, its
    tokenizer and its weights: transformers' readers (gguf-py's ``GGUFReader``, its own
    ``read_gguf_metadata``), which would each parse the file again, are answered from that parse, and
    build the config and tokenizer they build reading the file themselves."""
    file = embedded_gguf_path()
    config = transformers.AutoConfig.from_pretrained(file.parent, gguf_file=file.name).to_dict()
    tokenizer = transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)

    parses = []
    parse = gguf_file.GGUFFile._parse
    monkeypatch.setattr(gguf_file.GGUFFile, "_parse", lambda self: (parses.append(self.path), parse(self))[1])

    def read_again(*args, **kwargs):
        raise AssertionError(f"the GGUF was read again: {args}")

    from transformers.integrations import gguf as integration
    from transformers.integrations.gguf import reader

    monkeypatch.setattr(gguf, "GGUFReader", read_again)
    monkeypatch.setattr(reader, "read_gguf_metadata", read_again)
    monkeypatch.setattr(integration, "read_gguf_metadata", read_again)
    source = open_model(str(file))
    assert parses == [file]
    ours = source.hf_config.to_dict()
    assert ours.pop("quantization_config")["quant_method"] == "gguf"  # the loader's additions
    assert ours.pop("architectures") == ["LlamaForCausalLM"] and config.pop("architectures") is None
    assert ours == config
    assert source.tokenizer.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    assert source.tokenizer.init_kwargs == tokenizer.init_kwargs
    assert next(iter(source.weights()))[1].dtype == torch.float32
    assert gguf.GGUFReader is read_again  # put back as it was found


@pytest.mark.parametrize("content", [b"", b"GGUF", b"GGML" + bytes(60), b"GGUF" + bytes([9, 0, 0, 0]) + bytes(56)])
def test_an_unreadable_gguf_is_named(tmp_path, content):
    file = tmp_path / "model.gguf"
    file.write_bytes(content)
    with pytest.raises(ModelLoadError, match=f"{file}: not a (readable )?GGUF file|{file}: GGUF version 9"):
        open_model(str(file))
