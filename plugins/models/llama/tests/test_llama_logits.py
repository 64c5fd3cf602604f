"""Logits of the Llama-family models against HF transformers in float32.

Tiny random checkpoints are saved with transformers, opened with ``kvserve.loader`` and run
through the paged KV cache of the CPU attention backend: a mixed step of prefills (one of
them chunked), then decode steps, every computed position compared with HF's full-sequence
forward.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
import transformers

from kvserve.layers import UnquantizedLinearMethod
from kvserve.loader import open_model
from kvserve.testing.hf_models import build_tiny_model
from kvserve_models_llama import model as llama

ATOL = 1e-4

# name -> (tiny-model arch, config overrides, our class)
VARIANTS = {
    "llama-gqa": ("llama", {}, llama.LlamaForCausalLM),
    "llama-mha-tied-bias": (
        "llama",
        {"num_key_value_heads": 4, "tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True},
        llama.LlamaForCausalLM,
    ),
    "mistral-gqa": ("mistral", {"num_key_value_heads": 1}, llama.MistralForCausalLM),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}, llama.Qwen2ForCausalLM),
    "qwen3-gqa": ("qwen3", {}, llama.Qwen3ForCausalLM),
    "qwen3-mha-bias": ("qwen3", {"num_key_value_heads": 4, "attention_bias": True}, llama.Qwen3ForCausalLM),
}

PROMPT_LENS = [7, 13, 3]
CHUNK = 8  # the 13-token prompt is prefilled in two chunks, the second beside decodes
DECODE_STEPS = 4


def save_randomized_checkpoint(arch: str, path: Path, **overrides) -> Path:
    """A tiny HF checkpoint whose biases and norm weights are random too, so loading them is checked."""
    build_tiny_model(arch, path, **overrides)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if param.dim() == 1:
                base = 1.0 if "norm" in name else 0.0
                param.copy_(base + 0.3 * torch.randn(param.shape, generator=generator))
    hf_model.save_pretrained(path, safe_serialization=True)
    return path


def load_ours(path: Path, cls: type[llama.LlamaForCausalLM], extra_weights=()) -> llama.LlamaForCausalLM:
    source = open_model(str(path))
    assert source.hf_config.architectures == [cls.__name__]
    model = cls(source.hf_config, UnquantizedLinearMethod())
    model.load_weights(itertools.chain(source.weights(), extra_weights))
    return model.eval()


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request, tmp_path_factory):
    arch, overrides, cls = VARIANTS[request.param]
    path = save_randomized_checkpoint(arch, tmp_path_factory.mktemp(request.param), **overrides)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, cls, hf_model


def test_prefill_chunked_prefill_and_decode_logits_match_hf(variant, paged_sequences):
    path, cls, hf_model = variant
    model = load_ours(path, cls)
    vocab = hf_model.config.vocab_size
    generator = torch.Generator().manual_seed(2)
    sequences = [torch.randint(3, vocab, (n + DECODE_STEPS,), generator=generator).tolist() for n in PROMPT_LENS]
    with torch.no_grad():
        expected = [hf_model(torch.tensor([seq])).logits[0] for seq in sequences]

    runner = paged_sequences(model, len(sequences))
    computed: list[list[torch.Tensor]] = [[] for _ in sequences]

    def run(chunks: dict[int, list[int]]) -> None:
        for seq, logits in runner.step(chunks).items():
            computed[seq].append(logits)

    prompts = [seq[:n] for seq, n in zip(sequences, PROMPT_LENS)]
    run({0: prompts[0], 1: prompts[1][:CHUNK], 2: prompts[2]})
    run({0: [sequences[0][PROMPT_LENS[0]]], 1: prompts[1][CHUNK:], 2: [sequences[2][PROMPT_LENS[2]]]})
    while unfinished := [i for i, seq in enumerate(sequences) if runner.lengths[i] < len(seq)]:
        run({i: [sequences[i][runner.lengths[i]]] for i in unfinished})  # decodes

    for seq, logits in enumerate(computed):
        ours = torch.cat(logits)
        assert ours.shape == expected[seq].shape
        torch.testing.assert_close(ours, expected[seq], atol=ATOL, rtol=0)


def test_tied_checkpoint_may_carry_lm_head(tmp_path):
    path = build_tiny_model("llama", tmp_path, tie_word_embeddings=True)
    embedding = dict(open_model(str(path)).weights())["model.embed_tokens.weight"]
    model = load_ours(path, llama.LlamaForCausalLM, extra_weights=[("lm_head.weight", embedding)])
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.testing.assert_close(model.lm_head.weight, embedding, atol=0, rtol=0)


def test_unknown_and_missing_tensors_are_named(tmp_path):
    path = build_tiny_model("llama", tmp_path)
    source = open_model(str(path))
    model = llama.LlamaForCausalLM(source.hf_config, UnquantizedLinearMethod())
    with pytest.raises(KeyError, match="model.layers.0.mlp.extra.weight"):
        model.load_weights(itertools.chain(source.weights(), [("model.layers.0.mlp.extra.weight", torch.ones(1))]))
    missing_norm = (item for item in source.weights() if item[0] != "model.norm.weight")
    with pytest.raises(KeyError, match="model.norm.weight"):
        model.load_weights(missing_norm)
