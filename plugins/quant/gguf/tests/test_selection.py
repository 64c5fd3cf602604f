"""Which method a GGUF's ``quantization_config`` gets, as the engine resolves it (the real file's config)."""

import pytest

from kvserve.config import EngineConfig
from kvserve.layers import UnquantizedLinearMethod
from kvserve.loader import open_model
from kvserve.loader.default_model import embedded_gguf_path
from kvserve.runner.model_settings import _quant_method
from kvserve_quant_gguf.method import GGUFLinearMethod


@pytest.fixture(scope="module")
def hf_config():
    return open_model(str(embedded_gguf_path())).hf_config


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, GGUFLinearMethod),
        ({"quantization": "gguf"}, GGUFLinearMethod),
        ({"quantization": "none"}, UnquantizedLinearMethod),
        ({"tensor_parallel_size": 2}, GGUFLinearMethod),  # each rank keeps its whole blocks
    ],
    ids=["auto", "gguf", "none", "auto-tp2"],
)
def test_the_method_a_gguf_gets(hf_config, fields, expected):
    method = _quant_method(EngineConfig.from_flat(**fields), hf_config)
    assert type(method) is expected


def test_the_file_names_each_linear_weight_type(hf_config):
    config = hf_config.quantization_config
    assert config["quant_method"] == "gguf" and config["split_count"] == 1
    assert config["tensor_types"]["model.layers.0.self_attn.q_proj"] == "Q4_1"
    assert config["tensor_types"]["model.embed_tokens"] == "Q8_0"
