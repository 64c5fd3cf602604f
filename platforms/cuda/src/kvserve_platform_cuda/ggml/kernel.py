"""TritonGGMLKernel: the CUDA platform's LinearKernel, for GGUF layers' GGML blocks only."""

from __future__ import annotations

import functools
import logging

import torch

from kvserve.interfaces.linear_kernel import LinearKernel

logger = logging.getLogger("kvserve")


class TritonGGMLKernel(LinearKernel):
    """``x @ W.T`` for weights held as GGML blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q4_K,
    Q5_K, Q6_K): one Triton dequantize-GEMM, each program dequantizing the tiles of ``W`` it multiplies
    (never the whole matrix) and accumulating in float32. Dense weights stay on ``F.linear`` (cuBLAS): :meth:`pack`
    takes none."""

    name = "triton-ggml"

    @functools.cached_property
    def ggml_types(self) -> frozenset[str]:
        """The block types of ``triton_ggml``, asked when a GGUF model's layers are offered the kernel:
        triton loads then (only GGUF models pay for it); none where triton is not installed."""
        try:
            from kvserve_platform_cuda.ggml.triton_ggml import TYPES
        except ModuleNotFoundError as exc:
            if exc.name != "triton":
                raise
            logger.warning("triton is not installed: GGUF layers dequantize their weight every call")
            return frozenset()
        self._block_sizes = {name: (weights, size) for name, (_, weights, size) in TYPES.items()}
        """Weights and bytes per block of each type, to find each part's blocks."""
        return frozenset(TYPES)

    def pack(self, weight: torch.Tensor) -> torch.Tensor | None:
        """``None``: cuBLAS's ``F.linear`` is what dense weights run fastest on."""
        return None

    def apply(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Never reached: :meth:`pack` packs no weight."""
        raise NotImplementedError(f"{type(self).__name__} packs no dense weights")

    def apply_ggml(self, x: torch.Tensor, blocks: torch.Tensor, parts: tuple[tuple[str, int], ...]) -> torch.Tensor:
        """The dequantize-GEMM per part on ``x`` as it is (bfloat16 and float16 on the tensor cores, the
        weight's tiles rounded to that dtype as the dequantized weight would be), accumulated in float32,
        the parts side by side in ``x``'s dtype."""
        # asking ggml_types loads the op where no one has yet (at load use_linear_kernel has: a compiled
        # forward finds it cached, a plain attribute then, which dynamo traces)
        outputs, offset = [], 0
        for ggml_type, out_features in parts:
            if ggml_type not in self.ggml_types:
                raise ValueError(f"{type(self).__name__} multiplies {sorted(self.ggml_types)} blocks, not {ggml_type}")
            block_weights, block_bytes = self._block_sizes[ggml_type]
            size = out_features * (x.shape[-1] // block_weights) * block_bytes
            part = blocks[offset : offset + size]
            outputs.append(torch.ops.kvserve_cuda_ggml.ggml_linear.default(x, part, ggml_type, out_features))
            offset += size
        if offset != blocks.numel():
            raise ValueError(f"GGML blocks: {blocks.numel()} bytes, where the parts {parts} hold {offset}")
        return (outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)).to(x.dtype)
