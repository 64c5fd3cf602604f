"""oneDNN matmul on weights reordered once into its blocked layout (what inductor's freezing does).

The CPU platform's fallback: dtypes the native kernel (``native_linear.py``) does not run, CPUs
with neither AVX-512 nor AVX2, and machines where the native kernel cannot be built.

``F.linear`` re-lays the weight out on every call (bfloat16, through oneDNN) or runs MKL's
sgemm (float32), which on AMD CPUs takes a generic code path; a weight reordered once for
oneDNN's AVX-512 kernels measured 1.1-3.8x faster on every projection of the 125M Llama and
SmolLM2 at 1-64 and 512 rows (``benchmarks/gemm_shapes.py``). As vLLM's CPU build does, the
layout is chosen for a 32-row batch and serves every batch size.

Compiled levels (``torch.compile``) call the same matmul through the opaque op
``kvserve_cpu::onednn_linear``: inductor's own lowering of ``mkldnn._linear_pointwise`` takes
only weights it froze into the graph as constants, while the op takes the packed weight as an
ordinary graph input, so every level runs on the same packed weights and the elementwise ops
around the matmuls still fuse into inductor's kernels.
"""

from __future__ import annotations

import torch

from kvserve.interfaces import LinearKernel

PACK_BATCH_HINT = 32
"""Rows the weight layout is chosen for; it serves any row count (decode batches and prefills)."""


@torch.library.custom_op("kvserve_cpu::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` on ``packed``, the oneDNN-reordered ``W`` of :meth:`OneDnnLinearKernel.pack`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


@onednn_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


class OneDnnLinearKernel(LinearKernel):
    name = "onednn"

    def __init__(self, dtypes: frozenset[torch.dtype]) -> None:
        """``dtypes``: the weight dtypes to pack (others stay on ``F.linear``)."""
        self.dtypes = dtypes

    def pack(self, weight: torch.Tensor) -> torch.Tensor | None:
        if weight.device.type != "cpu" or weight.dim() != 2 or weight.dtype not in self.dtypes:
            return None
        return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)

    def apply(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return onednn_linear(x, packed, bias)
        # Eager: the mkldnn op directly, without the custom op's Python dispatch on every call.
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def onednn_linear_kernel() -> OneDnnLinearKernel | None:
    """The kernel for the dtypes this build and CPU run through oneDNN (None: neither)."""
    if not torch.backends.mkldnn.is_available():
        return None
    dtypes = {torch.float32}
    # Without native bf16 instructions oneDNN refuses bf16 matmul.
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        dtypes.add(torch.bfloat16)
    return OneDnnLinearKernel(frozenset(dtypes))
