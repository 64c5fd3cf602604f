"""Which layers slide, as transformers decides it for each family's config."""

import transformers

from kvserve_models_llama.model import sliding_window_of

BASE = {"num_hidden_layers": 4, "max_position_embeddings": 256}


def windows(config) -> list[int | None]:
    return [sliding_window_of(config, i) for i in range(config.num_hidden_layers)]


def test_mistral_window_applies_to_every_layer():
    assert windows(transformers.MistralConfig(sliding_window=6, **BASE)) == [6, 6, 6, 6]
    assert windows(transformers.MistralConfig(sliding_window=None, **BASE)) == [None] * 4


def test_qwen2_slides_from_max_window_layers_on_only_with_use_sliding_window():
    config = transformers.Qwen2Config(use_sliding_window=True, sliding_window=5, max_window_layers=2, **BASE)
    assert windows(config) == [None, None, 5, 5]
    assert windows(transformers.Qwen2Config(sliding_window=5, max_window_layers=2, **BASE)) == [None] * 4
    # transformers derives the same from layer_types; a config without them follows the same rule.
    bare = transformers.PretrainedConfig(use_sliding_window=True, sliding_window=5, max_window_layers=3, **BASE)
    assert windows(bare) == [None, None, None, 5]


def test_qwen3_and_explicit_layer_types():
    layer_types = ["sliding_attention", "full_attention"] * 2
    config = transformers.Qwen3Config(use_sliding_window=True, sliding_window=7, layer_types=layer_types, **BASE)
    assert windows(config) == [7, None, 7, None]


def test_a_window_no_sequence_can_exceed_is_dropped():
    assert windows(transformers.MistralConfig(sliding_window=256, **BASE)) == [None] * 4
    assert windows(transformers.LlamaConfig(**BASE)) == [None] * 4
