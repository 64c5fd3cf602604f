"""What the method refuses at load, by name: GGML types it does not run, split files, layers the file lacks."""

import pytest

from kvserve.errors import ConfigError
from kvserve.layers import ColumnLinear
from kvserve_quant_gguf.method import GGUFLinearMethod


@pytest.mark.parametrize("type_name", ["IQ2_XS", "IQ4_NL", "Q2_K", "Q3_K"])
def test_an_unsupported_type_is_refused_by_name(type_name):
    method = GGUFLinearMethod({"quant_method": "gguf", "tensor_types": {"model.layers.0.mlp.down_proj": type_name}})
    with pytest.raises(ConfigError, match=rf"model\.layers\.0\.mlp\.down_proj is {type_name} in the file.*Q4_K"):
        ColumnLinear(256, 64, False, method, "model.layers.0.mlp.down_proj")


def test_a_split_file_is_refused():
    with pytest.raises(ConfigError, match="split into 3 GGUF files.*llama-gguf-split --merge"):
        GGUFLinearMethod({"quant_method": "gguf", "tensor_types": {}, "split_count": 3})


def test_a_layer_without_a_tensor_and_a_partial_block_are_refused():
    method = GGUFLinearMethod({"quant_method": "gguf", "tensor_types": {"a": "Q4_K"}})
    with pytest.raises(ConfigError, match="no weight for the linear layer b"):
        ColumnLinear(256, 64, False, method, "b")
    with pytest.raises(ConfigError, match="a has 128 input features, not a multiple of Q4_K's 256-weight blocks"):
        ColumnLinear(128, 64, False, method, "a")


def test_a_model_that_is_not_a_gguf_file_is_refused():
    with pytest.raises(ConfigError, match="the model is not a GGUF file"):
        GGUFLinearMethod(None)
