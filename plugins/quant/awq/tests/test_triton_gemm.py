"""The Triton AWQ GEMM against the dequantized reference, under ``TRITON_INTERPRET=1`` on CPU
(set before triton is imported) or on a GPU when there is one."""

from __future__ import annotations

import os

import pytest
import torch

from kvserve_quant_awq.contract import AwqContract

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip(
    "triton", reason="the Triton AWQ GEMM needs triton (pip install kvserve-quant-awq[triton])"
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [(1, 128, 64, 32), (5, 256, 96, 128), (33, 192, 128, 64)]  # rows, in, out, group


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(("rows", "inp", "out", "group"), CASES, ids=lambda v: str(v))
def test_triton_awq_gemm_matches_the_dequantized_weight(rows, inp, out, group, dtype):
    from kvserve_quant_awq.triton_gemm import awq_gemm

    contract = AwqContract()
    contract.quant_config = {**AwqContract.quant_config, "group_size": group}
    gen = torch.Generator().manual_seed(rows)
    tensors = contract.quantize(torch.randn(out, inp, generator=gen) * inp**-0.5)
    x = torch.randn(rows, inp, generator=gen).to(getattr(torch, dtype))
    expected = x.double() @ contract.dequantize(tensors).double().T
    on_device = {name: t.to(DEVICE) for name, t in tensors.items()}
    got = awq_gemm(x.to(DEVICE), on_device["qweight"], on_device["qzeros"], on_device["scales"], group)
    assert got.dtype == x.dtype and got.shape == (rows, out)
    error = float((got.double().cpu() - expected).norm() / expected.norm())
    tolerance = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 2e-3}[dtype]
    print(f"triton awq gemm {rows}x{inp}x{out} group {group} {dtype} on {DEVICE}: relative error {error:.2e}")
    assert error <= tolerance
