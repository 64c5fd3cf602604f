"""Linear layers whose weight format is owned by a QuantizationMethod.

Models build every projection from these, fused ones included (qkv, gate-up), and never slice
checkpoint shards themselves: each parameter's :class:`ParamLoading` says where a shard lands,
so packed formats (AWQ's ``[in, out/8]`` int32) load into fused layers too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.errors import ConfigError, WeightLoadError
from kvserve.interfaces.quantization import ParamLoading, QuantizationMethod


class UnquantizedLinearMethod(QuantizationMethod):
    """Plain dense weights in the model dtype (the method used when nothing is quantized)."""

    name = "none"

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix) -> None:
        layer.add_param("weight", torch.empty(sum(output_sizes), input_size, dtype=params_dtype), ParamLoading())

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)


class LinearBase(torch.nn.Module):
    """``y = x W^T + b``; ``W`` is created, loaded and applied through ``quant_method``.

    ``shard_prefixes`` are the checkpoint module names of the fused shards, in output order
    (one entry, ``prefix``, for a plain layer). A layer whose every shard the method ignores
    gets dense weights; a fused layer only partly ignored is a config error.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        quant_method: QuantizationMethod,
        prefix: str,
        shard_prefixes: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.output_size = sum(output_sizes)
        self.prefix = prefix
        self.shard_prefixes = shard_prefixes or [prefix]
        if len(self.shard_prefixes) != len(self.output_sizes):
            raise ValueError(f"{prefix}: {len(self.shard_prefixes)} shard names for {len(output_sizes)} shards")
        self.param_loading: dict[str, ParamLoading] = {}
        """Parameter name -> how a checkpoint shard loads into it."""
        self.quant_method = self._method_for_layer(quant_method)
        params_dtype = torch.get_default_dtype()
        self.params_dtype = params_dtype
        """The model (activation) dtype the layer was built for."""
        self.quant_method.create_weights(self, input_size, self.output_sizes, params_dtype, prefix)
        if bias:
            self.add_param("bias", torch.zeros(self.output_size, dtype=params_dtype), ParamLoading())
        else:
            self.bias = None

    def _method_for_layer(self, quant_method: QuantizationMethod) -> QuantizationMethod:
        ignored = [p for p in self.shard_prefixes if quant_method.is_ignored(p)]
        if not ignored:
            return quant_method
        if len(ignored) < len(self.shard_prefixes):
            raise ConfigError(
                f"quantization: {quant_method.name} leaves {ignored} unquantized but not the other shards of "
                f"the fused layer {self.prefix}; a fused layer is quantized whole"
            )
        return UnquantizedLinearMethod()

    def add_param(self, name: str, tensor: torch.Tensor, loading: ParamLoading) -> None:
        """Register ``tensor`` as the frozen parameter ``name`` that checkpoint tensors load into."""
        setattr(self, name, torch.nn.Parameter(tensor, requires_grad=False))
        self.param_loading[name] = loading

    def load(self, name: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """Copy the checkpoint tensor ``name`` of shard index ``shard`` into its part of the parameter."""
        loading = self.param_loading[name]
        param = getattr(self, name).data
        tensor_name = f"{self.shard_prefixes[shard]}.{name}"
        if loading.per_shard:
            target = param.narrow(0, shard, 1)
        elif loading.output_dim is None:
            target = param
        else:
            start, size = sum(self.output_sizes[:shard]), self.output_sizes[shard]
            if start % loading.packed_factor or size % loading.packed_factor:
                raise WeightLoadError(
                    f"{tensor_name}: {size} output features at offset {start} are not a multiple of the "
                    f"packing factor {loading.packed_factor}"
                )
            target = param.narrow(loading.output_dim, start // loading.packed_factor, size // loading.packed_factor)
        if tensor.shape != target.shape:
            if tensor.numel() == target.numel() == 1:  # a per-tensor scale saved as [] or [1]
                tensor = tensor.reshape(target.shape)
            else:
                raise WeightLoadError(f"{tensor_name}: expected shape {tuple(target.shape)}, got {tuple(tensor.shape)}")
        target.copy_(tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ColumnLinear(LinearBase):
    """A plain projection (its output features split across ranks under tensor parallelism)."""

    def __init__(self, input_size: int, output_size: int, bias: bool, quant_method: QuantizationMethod, prefix: str):
        super().__init__(input_size, [output_size], bias, quant_method, prefix)


class RowLinear(LinearBase):
    """A projection back to the hidden size (o_proj, down_proj: its input features split across
    ranks under tensor parallelism)."""

    def __init__(self, input_size: int, output_size: int, bias: bool, quant_method: QuantizationMethod, prefix: str):
        super().__init__(input_size, [output_size], bias, quant_method, prefix)


class MergedColumnLinear(LinearBase):
    """Several checkpoint projections of the same input fused along the output features
    (q/k/v, gate/up): one matmul; shard ``i`` is the checkpoint module ``shard_prefixes[i]``."""

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        quant_method: QuantizationMethod,
        prefix: str,
        shard_prefixes: list[str],
    ) -> None:
        super().__init__(input_size, output_sizes, bias, quant_method, prefix, shard_prefixes)
