"""Rotary tables are computed on the host for every rope type and land where they are asked to."""

import pytest
import torch
from transformers import LlamaConfig

from kvserve.layers.rotary import RotaryEmbedding

ROPE_SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}


def config(rope_type: str) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=64, num_attention_heads=4, max_position_embeddings=256, rope_scaling=ROPE_SCALINGS[rope_type]
    )


@pytest.mark.parametrize("rope_type", ROPE_SCALINGS)
def test_tables_never_touch_the_default_device(rope_type):
    """Under a meta default device nothing is computed there: explicit CPU tables equal a plain build."""
    reference = RotaryEmbedding(config(rope_type), 16, 256)
    with torch.device("meta"):
        on_cpu = RotaryEmbedding(config(rope_type), 16, 256, device=torch.device("cpu"))
        default = RotaryEmbedding(config(rope_type), 16, 256)
    assert on_cpu.cos.device.type == "cpu" and torch.equal(on_cpu.cos, reference.cos)
    assert torch.equal(on_cpu.sin, reference.sin)
    assert default.cos.device.type == "meta" and default.cos.shape == reference.cos.shape  # the build context's
