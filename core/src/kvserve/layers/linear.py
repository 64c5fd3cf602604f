"""Linear layers whose weight format is owned by a QuantizationMethod, tensor-parallel by rank.

Models build every projection from these, fused ones included (qkv, gate-up), and never slice
checkpoint shards themselves: each parameter's :class:`ParamLoading` says where a shard lands,
so packed formats (AWQ's ``[in, out/8]`` int32) load into fused layers too.

Under tensor parallelism (``kvserve.distributed.world_size() > 1`` when the layer is built) a
column layer holds its rank's slice of every shard's output features and a row layer its slice
of the input features, summing the partial products over ranks; each rank loads only its slice
of the checkpoint tensors, cut along ``ParamLoading.output_dim`` / ``input_dim`` (or, for shards
packed at different rates, by rows and groups of each shard: ``ParamLoading.shard_groups``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve import distributed
from kvserve.errors import ConfigError, WeightLoadError
from kvserve.interfaces.quantization import ParamLoading, QuantizationMethod


class UnquantizedLinearMethod(QuantizationMethod):
    """Plain dense weights in the model dtype (the method used when nothing is quantized)."""

    name = "none"

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix) -> None:
        weight = torch.empty(sum(output_sizes), input_size, dtype=params_dtype)
        layer.add_param("weight", weight, ParamLoading(input_dim=1))

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)


class LinearBase(torch.nn.Module):
    """``y = x W^T + b``; ``W`` is created, loaded and applied through ``quant_method``.

    ``shard_prefixes`` are the checkpoint module names of the fused shards, in output order
    (one entry, ``prefix``, for a plain layer). A layer whose every shard the method ignores
    gets dense weights; a fused layer only partly ignored is a config error.

    ``input_size`` and ``output_sizes`` are this rank's; ``shard_slices`` (column layers) gives,
    per shard, the ``(offset, size)`` of this rank's output features within the checkpoint
    tensor, ``input_slice`` (row layers) the ``(offset, size)`` of its input features.
    ``full_input_size`` and ``full_output_sizes`` are the checkpoint's (unsharded, unpacked)
    features, the rank's by default.
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        quant_method: QuantizationMethod,
        prefix: str,
        shard_prefixes: list[str] | None = None,
        shard_slices: list[tuple[int, int]] | None = None,
        input_slice: tuple[int, int] | None = None,
        full_input_size: int | None = None,
        full_output_sizes: list[int] | None = None,
    ) -> None:
        super().__init__()
        self.shard_slices = shard_slices
        self.input_slice = input_slice
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.full_input_size = full_input_size or input_size
        self.full_output_sizes = list(full_output_sizes or output_sizes)
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
            self.add_param(
                "bias", torch.zeros(self.output_size, dtype=params_dtype), ParamLoading(input_replicated=True)
            )
        else:
            self.bias = None
        self.lora: torch.nn.Module | None = None
        """With LoRA on, the adapters' slots (``kvserve.lora.layers.LoRALinear``): ``lora(x, y)`` adds
        each token's adapter term to the base output ``y``; None: the base layer alone."""

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
        tensor = self._rank_slice(tensor_name, tensor, loading, shard)
        if loading.per_shard:
            target = param.narrow(0, shard, 1)
        elif loading.output_dim is None:
            target = param
        elif loading.shard_offsets is not None:
            start, end = loading.shard_offsets[shard], loading.shard_offsets[shard + 1]
            target = param.narrow(loading.output_dim, start, end - start)
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

    def _rank_slice(self, tensor_name: str, tensor: torch.Tensor, loading: ParamLoading, shard: int) -> torch.Tensor:
        """This rank's part of the checkpoint tensor (all of it without tensor parallelism)."""
        if distributed.world_size() == 1:
            return tensor
        if loading.shard_offsets is not None:
            if loading.shard_groups is None:
                raise WeightLoadError(
                    f"{tensor_name}: quantization method {self.quant_method.name!r} packs shards at different "
                    "rates without saying how each shard's rows run (ParamLoading.shard_groups), so it cannot "
                    "be split across tensor-parallel ranks"
                )
            return self._rank_rows(tensor_name, tensor, loading.shard_groups[shard], shard)
        if self.shard_slices is not None and loading.output_dim is not None:
            start, size = self.shard_slices[shard]
            if start % loading.packed_factor or size % loading.packed_factor:
                raise WeightLoadError(
                    f"{tensor_name}: this rank's {size} output features at offset {start} are not a multiple "
                    f"of the packing factor {loading.packed_factor}; choose a tensor_parallel_size that keeps "
                    "them whole"
                )
            tensor = tensor.narrow(loading.output_dim, start // loading.packed_factor, size // loading.packed_factor)
        if self.input_slice is not None and not loading.input_replicated:
            if loading.input_dim is None:
                raise WeightLoadError(
                    f"{tensor_name}: quantization method {self.quant_method.name!r} does not say how this "
                    "parameter splits by input features (ParamLoading.input_dim / input_replicated), so the "
                    f"row-parallel {self.prefix} cannot be split across tensor-parallel ranks"
                )
            start, size = self.input_slice
            group = loading.input_group
            if start % group or size % group:
                raise WeightLoadError(
                    f"{tensor_name}: this rank's {size} input features at offset {start} do not fall on the "
                    f"{group}-feature groups of {self.quant_method.name!r}; choose a tensor_parallel_size that "
                    "keeps them whole"
                )
            tensor = tensor.narrow(loading.input_dim, start // group, size // group)
        return tensor

    def _rank_rows(self, tensor_name: str, tensor: torch.Tensor, groups: tuple[int, int], shard: int) -> torch.Tensor:
        """This rank's part, flat, of shard ``shard``'s checkpoint tensor laid out as
        ``ParamLoading.shard_groups`` says: rows of output features, each row's input features in
        groups of ``features`` held in ``elements`` elements."""
        features, elements = groups
        rows, in_features = self.full_output_sizes[shard], self.full_input_size
        row_elements = in_features // features * elements
        if in_features % features or tensor.numel() != rows * row_elements:
            raise WeightLoadError(
                f"{tensor_name}: expected {rows} rows of {in_features} input features in groups of {features} "
                f"held in {elements} elements ({rows * row_elements} elements), got shape {tuple(tensor.shape)}"
            )
        matrix = tensor.reshape(rows, row_elements)
        if self.shard_slices is not None:
            start, size = self.shard_slices[shard]
            matrix = matrix.narrow(0, start, size)
        if self.input_slice is not None:
            start, size = self.input_slice
            if start % features or size % features:
                raise WeightLoadError(
                    f"{tensor_name}: this rank's {size} input features at offset {start} do not fall on the "
                    f"{features}-feature groups of {self.quant_method.name!r}; choose a tensor_parallel_size "
                    "that keeps them whole"
                )
            matrix = matrix.narrow(1, start // features * elements, size // features * elements)
        return matrix.reshape(-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.quant_method.apply(self, x, self.bias)
        return y if self.lora is None else self.lora(x, y)


def _split(size: int, what: str, prefix: str) -> int:
    """``size`` per rank; a config error when the ranks cannot share it evenly."""
    ranks = distributed.world_size()
    if size % ranks:
        raise ConfigError(f"tensor_parallel_size: {prefix} has {size} {what}, which {ranks} ranks cannot share evenly")
    return size // ranks


class ColumnLinear(LinearBase):
    """A plain projection; under tensor parallelism each rank holds a slice of its output features."""

    def __init__(self, input_size: int, output_size: int, bias: bool, quant_method: QuantizationMethod, prefix: str):
        per_rank = _split(output_size, "output features", prefix)
        slices = [(distributed.rank() * per_rank, per_rank)]
        super().__init__(
            input_size, [per_rank], bias, quant_method, prefix, shard_slices=slices, full_output_sizes=[output_size]
        )


class RowLinear(LinearBase):
    """A projection back to the hidden size (o_proj, down_proj); under tensor parallelism each rank
    holds a slice of its input features and the partial outputs are summed over ranks (the bias
    added once, after the sum)."""

    def __init__(self, input_size: int, output_size: int, bias: bool, quant_method: QuantizationMethod, prefix: str):
        per_rank = _split(input_size, "input features", prefix)
        input_slice = (distributed.rank() * per_rank, per_rank)
        super().__init__(
            per_rank, [output_size], bias, quant_method, prefix, input_slice=input_slice, full_input_size=input_size
        )
        self.reduce = distributed.world_size() > 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.reduce:
            return super().forward(x)
        partial = self.quant_method.apply(self, x, None)
        if self.lora is not None:
            # The slots hold this rank's input rows of A (split as W is) and all of B: each rank adds
            # (x_r A_r) B to its partial product, and the all-reduce's sum is (sum_r x_r A_r) B = x A B,
            # the one-rank result, with no collective of its own for the shrunk h.
            partial = self.lora(x, partial)
        out = distributed.all_reduce(partial)
        return out if self.bias is None else out + self.bias


class MergedColumnLinear(LinearBase):
    """Several checkpoint projections of the same input fused along the output features
    (q/k/v, gate/up): one matmul; shard ``i`` is the checkpoint module ``shard_prefixes[i]``.

    Under tensor parallelism each rank holds its slice of every shard (``shard_slices`` overrides
    the even split: the ``(offset, size)`` of each shard's features this rank takes).
    """

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        bias: bool,
        quant_method: QuantizationMethod,
        prefix: str,
        shard_prefixes: list[str],
        shard_slices: list[tuple[int, int]] | None = None,
    ) -> None:
        if shard_slices is None:
            rank = distributed.rank()
            per_rank = [_split(size, "output features in a shard", prefix) for size in output_sizes]
            shard_slices = [(rank * size, size) for size in per_rank]
        sizes = [size for _, size in shard_slices]
        super().__init__(
            input_size, sizes, bias, quant_method, prefix, shard_prefixes, shard_slices, full_output_sizes=output_sizes
        )


class QKVLinear(MergedColumnLinear):
    """The fused q/k/v projection: this rank's query heads and its KV heads.

    Query heads split evenly over ranks; KV heads too when there are at least as many as ranks,
    otherwise each KV head is replicated on the ranks whose query heads use it (GQA with fewer
    KV heads than ranks). :attr:`num_heads` / :attr:`num_kv_heads` are this rank's.
    """

    def __init__(
        self,
        input_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        bias: bool,
        quant_method: QuantizationMethod,
        prefix: str,
        shard_prefixes: list[str],
    ) -> None:
        rank, ranks = distributed.rank(), distributed.world_size()
        q_heads = _split(num_heads, "query heads", prefix)
        if num_kv_heads >= ranks:
            kv_heads = _split(num_kv_heads, "KV heads", prefix)
            kv_start = rank * kv_heads
        elif ranks % num_kv_heads:
            raise ConfigError(
                f"tensor_parallel_size: {prefix} has {num_kv_heads} KV heads, fewer than {ranks} ranks and "
                "not a divisor of it, so they cannot be replicated evenly"
            )
        else:
            kv_heads, kv_start = 1, rank // (ranks // num_kv_heads)
        q_slice = (rank * q_heads * head_dim, q_heads * head_dim)
        kv_slice = (kv_start * head_dim, kv_heads * head_dim)
        super().__init__(
            input_size, [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], bias,
            quant_method, prefix, shard_prefixes, [q_slice, kv_slice, kv_slice],
        )  # fmt: skip
        self.num_heads, self.num_kv_heads = q_heads, kv_heads
