"""The decoder skeleton: its module paths are HF's checkpoint names for both layouts, its gated
activations are HF's, and a spec that does not fit the config is refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from transformers.activations import ACT2FN

from kvserve.layers import DecoderForCausalLM, DecoderSpec, UnquantizedLinearMethod, gated_activation
from kvserve.layers.loading import checkpoint_targets

TINY = dict(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
)  # fmt: skip


class LlamaLayout(DecoderForCausalLM):
    @classmethod
    def decoder_spec(cls, hf_config: Any) -> DecoderSpec:
        return DecoderSpec(qkv_bias=True, o_bias=True, mlp_bias=True)


class GemmaLayout(DecoderForCausalLM):
    @classmethod
    def decoder_spec(cls, hf_config: Any) -> DecoderSpec:
        return DecoderSpec(
            activation="gelu_tanh", qk_norm=True, norm_offset=1.0, sandwich_norms=True,
            embedding_scale=hf_config.hidden_size**0.5, rope_layer_types=tuple(hf_config.layer_types),
        )  # fmt: skip


@pytest.mark.parametrize(
    ("ours", "hf_config"),
    [
        (LlamaLayout, transformers.LlamaConfig(**TINY, attention_bias=True, mlp_bias=True)),
        (GemmaLayout, transformers.Gemma3TextConfig(**TINY, tie_word_embeddings=False)),
    ],
)
def test_checkpoint_names_are_hf_names(ours, hf_config):
    hf_names = set(transformers.AutoModelForCausalLM.from_config(hf_config).state_dict())
    model = ours(hf_config, UnquantizedLinearMethod())
    optional = {name for name, target in checkpoint_targets(model).items() if target.optional}
    assert set(checkpoint_targets(model)) - optional == hf_names


@pytest.mark.parametrize(("name", "hf_name"), [("silu", "silu"), ("gelu_tanh", "gelu_pytorch_tanh")])
def test_gated_activation_is_hf(name, hf_name):
    gate, up = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(gated_activation(name)(gate, up), ACT2FN[hf_name](gate) * up)


def test_unknown_activation_is_named():
    with pytest.raises(ValueError, match=r"gated activation 'relu' is unknown \(known: \['gelu_tanh', 'silu'\]\)"):
        gated_activation("relu")


def test_per_layer_spec_must_cover_every_layer():
    class WrongWindows(DecoderForCausalLM):
        @classmethod
        def decoder_spec(cls, hf_config: Any) -> DecoderSpec:
            return DecoderSpec(sliding_windows=(4,))

    with pytest.raises(ValueError, match=r"WrongWindows: DecoderSpec.sliding_windows has 1 entries .*=2"):
        WrongWindows(transformers.LlamaConfig(**TINY), UnquantizedLinearMethod())


def test_a_subclass_must_state_its_spec():
    with pytest.raises(NotImplementedError, match="DecoderForCausalLM must define decoder_spec"):
        DecoderForCausalLM(transformers.LlamaConfig(**TINY), UnquantizedLinearMethod())
