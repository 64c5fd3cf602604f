"""PagedAttention holds its layer's facts; attention_layers collects them in layer order."""

import pytest
import torch

from kvserve.interfaces import AttentionSpec, LayerAttentionSpec
from kvserve.layers import PagedAttention, attention_layers


def _model(*layers: PagedAttention) -> torch.nn.Module:
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(layers)
    return model


def test_attention_layers_follow_layer_idx_not_module_order():
    local = PagedAttention(4, 2, 16, 0.25, 1, sliding_window=8)
    capped = PagedAttention(4, 2, 16, 0.125, 0, logits_soft_cap=50.0)
    assert attention_layers(_model(local, capped)) == (
        LayerAttentionSpec(0.125, logits_soft_cap=50.0),
        LayerAttentionSpec(0.25, sliding_window=8),
    )


def test_layer_indices_must_be_each_used_once_from_zero():
    with pytest.raises(ValueError, match=r"layer indices must be 0 \.\. n-1, each once; got \[0, 2\]"):
        attention_layers(_model(PagedAttention(4, 2, 16, 0.25, 0), PagedAttention(4, 2, 16, 0.25, 2)))
    with pytest.raises(ValueError, match=r"got \[0, 0\]"):
        attention_layers(_model(PagedAttention(4, 2, 16, 0.25, 0), PagedAttention(4, 2, 16, 0.25, 0)))


def test_bad_layer_facts_name_the_field():
    with pytest.raises(ValueError, match="sliding_window: must be at least 1, got 0"):
        PagedAttention(4, 2, 16, 0.25, 0, sliding_window=0)
    with pytest.raises(ValueError, match="logits_soft_cap: must be positive"):
        PagedAttention(4, 2, 16, 0.25, 0, logits_soft_cap=0.0)


def test_spec_layer_kinds_and_cache_dtype():
    local, full = LayerAttentionSpec(0.25, sliding_window=4), LayerAttentionSpec(0.25)
    spec = AttentionSpec(4, 2, 16, torch.bfloat16, 16, torch.device("cpu"), (local, full, local, full))
    assert spec.num_layers == 4 and spec.layer_kinds == (local, full)
    assert spec.cache_dtype == torch.bfloat16
    assert AttentionSpec(4, 2, 16, torch.bfloat16, 16, torch.device("cpu"), (full,), torch.float16).cache_dtype == (
        torch.float16
    )
