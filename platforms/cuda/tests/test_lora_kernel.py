"""The Triton LoRA kernel against the platform contract's dense float64 reference
(``kvserve.testing.lora_reference``): without a GPU, in Triton's interpreter on CPU tensors
(``conftest.py`` sets ``TRITON_INTERPRET=1``); with one, compiled on CUDA tensors. The contract itself
(``test_contract.py``) runs it through ``CudaPlatform.lora_kernel()`` where CUDA is.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from kvserve.lora.layers import plan_lora_batch
from kvserve.testing.lora_reference import check_lora_kernel
from kvserve_platform_cuda.lora.common import SEGMENT_TILE
from kvserve_platform_cuda.lora.kernel import TritonLoRAKernel
from kvserve_platform_cuda.platform import CudaPlatform

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# bfloat16 inputs are multiplied in float32 under the interpreter (its 16-bit tl.dot is wrong);
# float16 runs on a GPU (scripts/gpu-check), where the interpreter's time is not spent.
DTYPES = [torch.float32, torch.bfloat16] + ([torch.float16] if DEVICE.type == "cuda" else [])


def test_kernels_run_where_expected():
    """Compiled on a GPU, or in the interpreter when there is none (never silently skipped)."""
    assert DEVICE.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    print(f"Triton LoRA kernels run on {DEVICE} (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')})")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_contract_case(dtype, seed):
    """The platform contract's case: segments of 1 to 9 tokens, empty ones, base rows between, 4 slots,
    3 packed slices."""
    print(check_lora_kernel(TritonLoRAKernel(), DEVICE, dtype, seed).summary)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_segments_longer_than_a_tile_and_wide_layers(dtype):
    """Prefill chunks over one and two tile boundaries, a rank, input and slice widths past one block
    (every loop and column block of both kernels), slices whose widths differ by blocks."""
    lengths = (1, 2, SEGMENT_TILE - 1, SEGMENT_TILE + 1, 2 * SEGMENT_TILE + 7, 2 * SEGMENT_TILE + 7)
    check = check_lora_kernel(
        TritonLoRAKernel(), DEVICE, dtype, seed=1, lengths=lengths, rank=80, in_features=300, widths=(300, 64, 20)
    )
    print(check.summary)
    assert max(check.segment_lengths) > 2 * SEGMENT_TILE, f"no segment spans three tiles: {check.segment_lengths}"


def test_one_kernel_serves_many_batches_and_layers():
    """Tiles are planned per batch and slice tables kept per layer: a second batch and a second layer
    through the same kernel object get their own."""
    kernel = TritonLoRAKernel()
    for seed, widths in [(5, (40, 16, 24)), (6, (32,)), (5, (40, 16, 24))]:
        check_lora_kernel(kernel, DEVICE, torch.float32, seed, widths=widths)


def test_mismatched_tensors_are_refused_by_name():
    """A dtype or rank that does not fit is a ValueError saying which, not a kernel reading garbage."""
    kernel, batch = TritonLoRAKernel(), plan_lora_batch(np.array([0, 0], dtype=np.int64), DEVICE)
    x, a = torch.zeros(2, 8, device=DEVICE), torch.zeros(1, 8, 4, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="lora_a is torch.bfloat16"):
        kernel.shrink(x, a, batch)
    y, h, b = torch.zeros(2, 8, device=DEVICE), torch.zeros(2, 4, device=DEVICE), torch.zeros(1, 2, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"ranks \[2\] for h of 4 columns"):
        kernel.expand(y, h, [b], batch)


def test_platform_module_does_not_import_triton():
    """Core and the platform module load without triton; it loads when ``lora_kernel()`` is asked."""
    probe = "import sys, kvserve_platform_cuda.plugin, kvserve_platform_cuda.platform; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: CudaPlatform cannot be instantiated here")
def test_cuda_platform_offers_the_triton_kernel():
    assert isinstance(CudaPlatform().lora_kernel(), TritonLoRAKernel)
