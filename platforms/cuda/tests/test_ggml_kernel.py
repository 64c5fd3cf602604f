"""The Triton GGML dequantize-GEMM against gguf-py: blocks from ``gguf.quants.quantize``, the reference
``x @ W.T`` in float64 on ``gguf.quants.dequantize``'s weight. Without a GPU in Triton's interpreter on
CPU tensors (``conftest.py``), with one compiled on CUDA tensors (``scripts/gpu-check``).
"""

from __future__ import annotations

import subprocess
import sys

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from kvserve_platform_cuda.ggml.kernel import TritonGGMLKernel

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"]
K_TYPES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
"""The K-quants, which gguf-py cannot quantize: random bytes but for the float16 fields, at these offsets."""
# 9 blocks of 32 weights: a partial last K tile on the GPU's 64-wide tiles and the interpreter's
# 256-wide ones (two K steps there); the K-quants' 2 super-blocks: a K step each in the interpreter;
# 75 output features: a partial column tile (two on the GPU)
IN_FEATURES, K_IN_FEATURES, OUT_FEATURES = 288, 512, 75


def quantized(ggml_type: str, out_features: int, in_features: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random weight's flat GGML blocks (uint8, on the device) and gguf-py's float64 dequantization of them."""
    rng = np.random.default_rng(seed)
    qtype = GGMLQuantizationType[ggml_type]
    if ggml_type in K_TYPES:
        # every bit pattern of the quants and 6-bit scales, with small finite scales
        block_weights, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        data = rng.integers(0, 256, (out_features * in_features // block_weights, block_bytes), dtype=np.uint8)
        for offset in K_TYPES[ggml_type]:
            halfs = rng.uniform(0.001, 0.01, data.shape[0]).astype(np.float16)
            data[:, offset : offset + 2] = halfs.view(np.uint8).reshape(-1, 2)
        data = data.reshape(out_features, -1)
    else:
        weight = rng.standard_normal((out_features, in_features)).astype(np.float32)
        weight[0, :32] += 4.0  # one block all positive: Q4_1/Q5_1's min and the top quant levels are hit
        data = gguf_quants.quantize(weight, qtype)
    dequantized = torch.from_numpy(gguf_quants.dequantize(data, qtype).astype(np.float64))
    return torch.from_numpy(data.reshape(-1).copy()).to(DEVICE), dequantized


def check(ggml_type: str, rows: int, dtype: torch.dtype, out_features: int = OUT_FEATURES, seed: int = 0) -> None:
    in_features = K_IN_FEATURES if ggml_type in K_TYPES else IN_FEATURES
    blocks, weight = quantized(ggml_type, out_features, in_features, seed)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    assert ggml_type in TritonGGMLKernel().ggml_types  # registers the op
    y = torch.ops.kvserve_cuda_ggml.ggml_linear(x.to(DEVICE), blocks, ggml_type, out_features)
    assert y.shape == (rows, out_features) and y.dtype == torch.float32, f"{tuple(y.shape)} {y.dtype}"
    # The kernel multiplies the weight rounded to x's dtype, as F.linear on the dequantized weight
    # would, accumulating in float32: against that the float64 product differs by float32 rounding.
    # bfloat16 is held to its own rounding of the exact weight instead: the interpreter truncates
    # float32 to bfloat16 where a GPU rounds to nearest even.
    if dtype == torch.bfloat16:
        reference, tolerance = x.double() @ weight.T, 1e-2
    else:
        reference, tolerance = x.double() @ weight.to(dtype).double().T, 1e-5
    error = ((y.cpu().double() - reference).norm() / reference.norm()).item()
    assert error < tolerance, f"{ggml_type} M={rows} {dtype}: relative error {error:.2e} against gguf-py"


@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("ggml_type", TYPES + list(K_TYPES))
def test_matches_gguf_dequantization(ggml_type, rows):
    """Each type, one row (a decode step), a few and more than one 16-row tile, float32 rows multiplied
    in full precision: the dequantization exactly."""
    check(ggml_type, rows, torch.float32)


@pytest.mark.parametrize("ggml_type", TYPES + list(K_TYPES))
def test_bfloat16_and_float16_rows(ggml_type):
    """The models' dtypes (on a GPU the tensor cores' inputs)."""
    check(ggml_type, 3, torch.bfloat16, out_features=33, seed=2)
    check(ggml_type, 17, torch.float16, out_features=33, seed=3)


def test_gguf_layer_with_shards_of_two_types_runs_on_the_kernel():
    """The GGUF method hands the kernel a fused layer whose shards differ in type (Gemma-3's Q4_K_M
    file: q/k in Q5_0, v in Q8_0), once offered it; every forward then multiplies each shard's blocks
    there, and the layer's output is the dequantized weight's product in the activations' dtype."""
    from kvserve.layers import MergedColumnLinear
    from kvserve.runner.build import default_dtype

    gguf_method = pytest.importorskip("kvserve_quant_gguf.method", reason="the GGUF plugin is not installed")
    types, sizes = ["Q5_0", "Q8_0"], [48, 16]
    config = {"quant_method": "gguf", "tensor_types": {"q": types[0], "v": types[1]}, "split_count": 1}
    method = gguf_method.GGUFLinearMethod(config)
    with default_dtype(torch.bfloat16):  # the layer's params_dtype: the model dtype
        layer = MergedColumnLinear(64, sizes, False, method, "qv", ["q", "v"]).to(DEVICE)
    shards = [quantized(t, n, 64, seed) for seed, (t, n) in enumerate(zip(types, sizes, strict=True))]
    layer.qweight.data.copy_(torch.cat([blocks for blocks, _ in shards]))
    method.process_weights_after_loading(layer)
    assert method.use_linear_kernel(layer, TritonGGMLKernel()), f"the kernel was refused {types}"
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    with torch.no_grad():
        y = layer(x.to(DEVICE))
    assert y.shape == (2, 3, sum(sizes)) and y.dtype == torch.bfloat16, f"{tuple(y.shape)} {y.dtype}"
    reference = x.double() @ torch.cat([weight for _, weight in shards]).T
    error = ((y.cpu().double() - reference).norm() / reference.norm()).item()
    assert error < 1e-2, f"relative error {error:.2e}"


def test_wrong_sized_blocks_are_refused():
    """Blocks that are not ``out_features`` rows of the type are a ValueError, not a read past the end."""
    blocks, _ = quantized("Q8_0", 4, 64, seed=0)
    with pytest.raises(ValueError, match="are not 5 rows of 64 weights"):
        TritonGGMLKernel().apply_ggml(torch.zeros(1, 64, device=DEVICE), blocks, (("Q8_0", 5),))
    with pytest.raises(ValueError, match="where the parts"):
        TritonGGMLKernel().apply_ggml(torch.zeros(1, 64, device=DEVICE), blocks, (("Q8_0", 3),))


def test_kernel_offers_the_block_types_and_packs_no_dense_weight():
    """What ``use_linear_kernel`` reads, and the dense layers left to cuBLAS."""
    kernel = TritonGGMLKernel()
    assert kernel.ggml_types == frozenset(TYPES) | frozenset(K_TYPES)
    assert kernel.pack(torch.zeros(8, 8, device=DEVICE)) is None


def test_compiled_forward_sees_one_op():
    """The op's fake gives its output's shape and dtype, so a compiled forward (fullgraph) traces it."""
    blocks, _ = quantized("Q4_0", 3, 64, seed=4)
    x = torch.randn(2, 64, dtype=torch.bfloat16, device=DEVICE)
    kernel = TritonGGMLKernel()
    _ = kernel.ggml_types  # registers the op, as the GGUF method's use_linear_kernel does at load
    torch.library.opcheck(torch.ops.kvserve_cuda_ggml.ggml_linear.default, (x, blocks, "Q4_0", 3))


def test_kernel_module_does_not_import_triton():
    """The platform offers the kernel to every engine; triton loads only when its types are asked."""
    probe = "import sys, kvserve_platform_cuda.ggml.kernel; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
