"""AutoAWQ's own GEMM packer and unpacker, for making and checking test checkpoints.

AutoAWQ (0.2.9, archived) is installed with ``--no-deps``: its package ``__init__`` imports the
whole quantization pipeline (``datasets``, transformers 4.x model classes), while the GEMM
packer (``WQLinear_GEMM.from_linear``) and ``dequantize_gemm`` are plain torch. So the package
is entered as a bare namespace and only those modules are imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

import pytest


class AutoAWQ:
    """AutoAWQ's ``WQLinear_GEMM`` and ``dequantize_gemm``, and checkpoint tensors made with them."""

    def __init__(self) -> None:
        self.wq_linear, self.dequantize_gemm = _import_autoawq()

    def linear_tensors(self, linear: Any, group_size: int) -> dict[str, Any]:
        """The checkpoint tensors AutoAWQ writes for ``linear`` (its grid, its packer)."""
        from kvserve_quant_awq.contract import awq_scales_and_zeros

        scales, zeros = awq_scales_and_zeros(linear.weight.data.float(), group_size)
        packed = self.wq_linear.from_linear(linear, 4, group_size, scales=scales, zeros=zeros)
        return {"qweight": packed.qweight, "qzeros": packed.qzeros, "scales": packed.scales}


@pytest.fixture(scope="session")
def autoawq() -> AutoAWQ:
    """AutoAWQ's packer; the test is skipped, saying how to install it, without AutoAWQ."""
    return AutoAWQ()


def _import_autoawq() -> tuple[Any, Any]:
    spec = importlib.util.find_spec("awq")
    if spec is None or spec.submodule_search_locations is None:
        pytest.skip("AutoAWQ is not installed (pip install --no-deps autoawq==0.2.9; `make install` does)")
    if "awq" not in sys.modules:
        package = types.ModuleType("awq")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["awq"] = package
    gemm = importlib.import_module("awq.modules.linear.gemm")
    packing = importlib.import_module("awq.utils.packing_utils")
    return gemm.WQLinear_GEMM, packing.dequantize_gemm
