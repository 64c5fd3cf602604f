"""Llama-family loading details beyond the model contract (``test_contract.py`` compares the
logits of every architecture and config variant with HF transformers)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from kvserve.errors import WeightLoadError
from kvserve.layers import UnquantizedLinearMethod
from kvserve.loader import open_model
from kvserve.testing.hf_models import build_tiny_model
from kvserve_models_llama import model as llama


def load_ours(path: Path, cls: type[llama.LlamaForCausalLM], extra_weights=()) -> llama.LlamaForCausalLM:
    source = open_model(str(path))
    assert source.hf_config.architectures == [cls.__name__]
    model = cls(source.hf_config, UnquantizedLinearMethod())
    model.load_weights(itertools.chain(source.weights(), extra_weights))
    return model.eval()


def test_tied_checkpoint_may_carry_lm_head(tmp_path):
    path = build_tiny_model("llama", tmp_path, tie_word_embeddings=True)
    embedding = dict(open_model(str(path)).weights())["model.embed_tokens.weight"]
    model = load_ours(path, llama.LlamaForCausalLM, extra_weights=[("lm_head.weight", embedding)])
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.testing.assert_close(model.lm_head.weight, embedding, atol=0, rtol=0)


def test_missing_tensors_are_named(tmp_path):
    path = build_tiny_model("llama", tmp_path)
    source = open_model(str(path))
    model = llama.LlamaForCausalLM(source.hf_config, UnquantizedLinearMethod())
    missing_norm = (item for item in source.weights() if item[0] != "model.norm.weight")
    with pytest.raises(WeightLoadError, match="model.norm.weight"):
        model.load_weights(missing_norm)
