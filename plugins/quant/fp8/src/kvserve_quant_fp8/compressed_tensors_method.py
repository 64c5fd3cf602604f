"""``quant_method: "compressed-tensors"`` checkpoints with FP8 weights (llmcompressor's ``FP8``,
``FP8_DYNAMIC`` schemes; ``format: "float-quantized"``).

Per linear layer: ``weight`` (float8_e4m3fn ``[out, in]``), ``weight_scale`` (float32 ``[1]``
per tensor or ``[out, 1]`` per channel) and, for static activation scales, ``input_scale``
(``[1]``). ``ignore`` names (or ``re:`` patterns) the layers left dense; ``kv_cache_scheme``
scales load into the attention layers. Any other scheme is refused at start, naming the field.
"""

from __future__ import annotations

from typing import Any

import torch

from kvserve.errors import ConfigError
from kvserve.interfaces import ParamLoading
from kvserve_quant_fp8.fp8_linear import FP8_DTYPE, finish_loading
from kvserve_quant_fp8.fp8_method import Fp8Method


def _require(field: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(
            f"quantization_config.{field}: {value!r} is not supported by kvserve-quant-fp8 "
            f"(supported: {', '.join(map(repr, allowed))})"
        )


class CompressedTensorsFp8Method(Fp8Method):
    """FP8 E4M3 weights with per-tensor or per-channel scales; activations stay in the model dtype on CPU."""

    name = "compressed-tensors"

    def __init__(self, quant_config=None) -> None:
        self.quant_config = quant_config or {}
        self.online = False
        config = self.quant_config
        _require("format", config.get("format"), ("float-quantized",))
        groups = config.get("config_groups") or {}
        if len(groups) != 1:
            raise ConfigError(f"quantization_config.config_groups: expected one group, got {len(groups)}")
        (group_name, group), *_ = groups.items()
        field = f"config_groups.{group_name}"
        _require(f"{field}.targets", group.get("targets"), (["Linear"],))
        weights = group.get("weights") or {}
        _require(f"{field}.weights.type", weights.get("type"), ("float",))
        _require(f"{field}.weights.num_bits", weights.get("num_bits"), (8,))
        _require(f"{field}.weights.strategy", weights.get("strategy"), ("tensor", "channel"))
        _require(f"{field}.weights.symmetric", weights.get("symmetric", True), (True,))
        _require(f"{field}.weights.dynamic", weights.get("dynamic", False), (False,))
        self.per_channel = weights["strategy"] == "channel"
        inputs = group.get("input_activations")
        self.static_inputs = False
        if inputs is not None:
            _require(f"{field}.input_activations.type", inputs.get("type"), ("float",))
            _require(f"{field}.input_activations.num_bits", inputs.get("num_bits"), (8,))
            if not inputs.get("dynamic", False):
                _require(f"{field}.input_activations.strategy", inputs.get("strategy"), ("tensor",))
                self.static_inputs = True

    def ignored_prefixes(self) -> list[str]:
        return list(self.quant_config.get("ignore") or [])

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix) -> None:
        if not self.per_channel:
            super().create_weights(layer, input_size, output_sizes, params_dtype, prefix)
            return
        out = sum(output_sizes)
        layer.add_param("weight", torch.empty(out, input_size, dtype=FP8_DTYPE), ParamLoading(input_dim=1))
        # One scale per output row: sliced with a column layer's rows, whole on a row-parallel rank.
        per_channel = ParamLoading(output_dim=0, input_replicated=True)
        layer.add_param("weight_scale", torch.ones(out, 1, dtype=torch.float32), per_channel)
        if self.static_inputs:
            per_shard = ParamLoading(output_dim=None, per_shard=True, input_replicated=True)
            layer.add_param("input_scale", torch.ones(len(output_sizes), dtype=torch.float32), per_shard)

    def process_weights_after_loading(self, layer) -> None:
        if not self.per_channel:
            super().process_weights_after_loading(layer)
            return
        if self.static_inputs:
            layer.input_scale = torch.nn.Parameter(layer.input_scale.data.max(), requires_grad=False)
        finish_loading(layer)
