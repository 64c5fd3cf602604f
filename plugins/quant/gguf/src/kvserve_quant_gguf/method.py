"""The ``gguf`` quantization method: each linear layer keeps its tensors' GGML blocks as the file has them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve import distributed
from kvserve.errors import ConfigError
from kvserve.interfaces import ParamLoading, QuantizationMethod
from kvserve_quant_gguf.ggml import FORMATS, BlockFormat

PARAM = "qweight"
"""The layer's parameter: every shard's blocks, flat uint8, shard after shard (the GGUF loader's name)."""


class GGUFLinearMethod(QuantizationMethod):
    """Linear weights in GGML blocks (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K and F32),
    one type per shard: a fused layer (q/k/v, gate/up) keeps each projection's type, as Gemma's
    Q4_K_M files mix Q5_0 and Q8_0 in one attention block.

    ``quant_config`` is what ``kvserve.loader`` reads from the file: ``tensor_types`` maps each
    weight's HF module name to its GGML type name; ``split_count`` how many files the model spans.
    A forward dequantizes the layer's shards into the activation dtype and runs one matmul. Where
    the platform's ``LinearKernel`` multiplies every shard's type (``ggml_types``), every forward
    goes to it instead (the CPU's: bfloat16/float16 activations, one to three rows of the 32-weight
    types (Q4_0 to Q8_0) on integer dots of activations quantized per block as llama.cpp does,
    everything else on tiles dequantized to bfloat16 in cache; float32 activations, never quantized,
    on tiles dequantized to float32, so that their products are the dequantized weight's up to the
    order of the sums).
    """

    name = "gguf"

    def __init__(self, quant_config=None) -> None:
        """Refuse a model that is not one GGUF file (the loader reads one file and names its types)."""
        super().__init__(quant_config)
        if "tensor_types" not in self.quant_config:
            raise ConfigError("quantization: gguf keeps a .gguf file's GGML blocks, and the model is not a GGUF file")
        self.tensor_types: dict[str, str] = self.quant_config["tensor_types"]
        split_count = self.quant_config.get("split_count", 1)
        if split_count > 1:
            raise ConfigError(
                f"quantization: gguf: the model is split into {split_count} GGUF files, which kvserve does not "
                "read; merge them first (llama.cpp's llama-gguf-split --merge)"
            )

    def _format(self, prefix: str) -> BlockFormat:
        """The block format of the file's tensor ``prefix``; a ConfigError naming it when it has none we run."""
        type_name = self.tensor_types.get(prefix)
        if type_name is None:
            raise ConfigError(f"quantization: gguf: the file has no weight for the linear layer {prefix}")
        fmt = FORMATS.get(type_name)
        if fmt is None:
            raise ConfigError(
                f"quantization: gguf: {prefix} is {type_name} in the file, a GGML type kvserve-quant-gguf does "
                f"not run (it runs {', '.join(FORMATS)}); quantization='none' dequantizes the file at load"
            )
        return fmt

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix) -> None:
        """One flat uint8 ``qweight`` of the shards' blocks; each shard's format and bytes on ``layer.ggml_shards``.

        Under tensor parallelism the sizes are the rank's and the loader keeps the rank's whole blocks
        (``ParamLoading.shard_groups``): a column-parallel rank its rows, a row-parallel rank the blocks
        of its input features in every row, which must not split a block (a ConfigError here)."""
        formats = [self._format(shard) for shard in layer.shard_prefixes]
        full_input = getattr(layer, "full_input_size", input_size)
        input_slice = getattr(layer, "input_slice", None)
        offsets = [0]
        for fmt, rows, shard in zip(formats, output_sizes, layer.shard_prefixes, strict=True):
            if full_input % fmt.block_size:
                raise ConfigError(
                    f"quantization: gguf: {shard} has {full_input} input features, not a multiple of "
                    f"{fmt.name}'s {fmt.block_size}-weight blocks"
                )
            if input_slice is not None and (input_slice[0] % fmt.block_size or input_slice[1] % fmt.block_size):
                raise ConfigError(
                    f"tensor_parallel_size: {distributed.world_size()} ranks would split the {full_input} input "
                    f"features of {shard}, a {fmt.name} weight of {fmt.block_size}-weight blocks, into "
                    f"{input_slice[1]} per rank, which cuts its blocks (a row-parallel rank holds whole ones): "
                    f"choose a tensor_parallel_size that divides its {full_input // fmt.block_size} blocks per row, "
                    "or quantization='none' to dequantize the file"
                )
            offsets.append(offsets[-1] + rows * fmt.row_bytes(input_size))
        blocks = torch.empty(offsets[-1], dtype=torch.uint8)
        groups = tuple((fmt.block_size, fmt.type_size) for fmt in formats)
        layer.add_param(PARAM, blocks, ParamLoading(shard_offsets=tuple(offsets), shard_groups=groups))
        layer.ggml_shards = list(zip(formats, output_sizes, offsets[:-1], offsets[1:], strict=True))
        """Per shard: its format, output features (the rank's) and byte range in ``qweight``."""
        layer.ggml_parts = _parts(layer.ggml_shards)
        """What the kernel multiplies (``LinearKernel.apply_ggml``): the shards as ``(ggml_type, out_features)``,
        neighbours of one type merged (their blocks are contiguous), so SmolLM2's all-Q4_1 q/k/v is one
        product, Gemma's Q5_0 q/k + Q8_0 v two parts of one call."""
        layer.ggml_kernel = None
        """The platform's LinearKernel where it multiplies every shard's type (:meth:`use_linear_kernel`)."""

    def keeps_embedding(self, prefix: str) -> bool:
        """Keep the file's embedding (``token_embd``; an untied ``output``) in its blocks, as vLLM's
        GGUF embedding does, where it is of a block type this method runs (an F32 one stays dense);
        under tensor parallelism each rank keeps its vocabulary shard's rows of blocks."""
        type_name = self.tensor_types.get(prefix)
        return type_name in FORMATS and type_name != "F32"

    def embedding(self, layer: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """The rows of ``ids`` (the layer's own rows: a rank's shard under tensor parallelism): their
        blocks gathered and dequantized, as the file's reference dequantization gives them (no other
        row is touched)."""
        fmt, _, start, stop = layer.ggml_shards[0]
        rows = layer.qweight[start:stop].view(-1, fmt.row_bytes(layer.input_size))[ids.reshape(-1)]
        weights = fmt.dequantize(rows.reshape(-1), layer.input_size, layer.params_dtype)
        return weights.view(*ids.shape, layer.input_size)

    def use_linear_kernel(self, layer, kernel) -> bool:
        """Take the kernel's products of the blocks where it runs every shard's type (``LinearKernel.apply_ggml``
        runs float32 activations as they are, on the weights as :meth:`dequantize` gives them)."""
        if any(f.name not in kernel.ggml_types for f, *_ in layer.ggml_shards):
            return False
        layer.ggml_kernel = kernel
        return True

    def dequantize(self, layer: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The layer's ``[out_features, in_features]`` weight in ``dtype``, shard by shard."""
        tiles = [fmt.dequantize(layer.qweight[a:b], layer.input_size, dtype) for fmt, _, a, b in layer.ggml_shards]
        return tiles[0] if len(tiles) == 1 else torch.cat(tiles)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias``: on the kernel where the layer has one, else ``W`` dequantized into ``x``'s
        dtype for this call only."""
        if layer.ggml_kernel is None:
            return F.linear(x, self.dequantize(layer, x.dtype), bias)
        y = layer.ggml_kernel.apply_ggml(x.reshape(-1, x.shape[-1]), layer.qweight, layer.ggml_parts)
        y = y.view(*x.shape[:-1], -1)
        return y if bias is None else y + bias


def _parts(shards: list[tuple[BlockFormat, int, int, int]]) -> tuple[tuple[str, int], ...]:
    """``shards`` (format, output features, byte range) as ``(ggml_type, out_features)``, each neighbour of
    the same format folded into the one before it."""
    parts = [(shards[0][0].name, shards[0][1])]
    for fmt, rows, _, _ in shards[1:]:
        if fmt.name == parts[-1][0]:
            parts[-1] = (fmt.name, parts[-1][1] + rows)
        else:
            parts.append((fmt.name, rows))
    return tuple(parts)
