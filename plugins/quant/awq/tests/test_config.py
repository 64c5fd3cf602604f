"""AWQ's config facts: modules left dense, and shapes the group size does not fit."""

import pytest
import torch

from kvserve.errors import ConfigError
from kvserve.layers import ColumnLinear
from kvserve_quant_awq.method import AwqMethod

CONFIG = {"quant_method": "awq", "version": "GEMM", "w_bit": 4, "q_group_size": 64, "zero_point": True}


def test_autoawq_field_names_and_modules_to_not_convert():
    method = AwqMethod({**CONFIG, "modules_to_not_convert": ["mlp.down_proj"]})
    assert method.group_size == 64
    dense = ColumnLinear(128, 64, False, method, "model.layers.0.mlp.down_proj")
    packed = ColumnLinear(128, 64, False, method, "model.layers.0.mlp.up_proj")
    assert dense.quant_method.name == "none" and dense.weight.shape == (64, 128)
    assert packed.quant_method is method and packed.qweight.shape == (128, 8) and packed.qweight.dtype == torch.int32


def test_a_group_size_that_does_not_divide_the_input_is_named():
    with pytest.raises(ConfigError, match=r"group_size: 64 does not divide the 96 input features of layer"):
        ColumnLinear(96, 64, False, AwqMethod(CONFIG), "layer")
