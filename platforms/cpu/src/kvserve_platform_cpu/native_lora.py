"""The CPU platform's LoRAKernel: SGMV and BGMV in C++ (``csrc/lora.cpp``), AVX-512 (with AVX512-BF16
dot products where the CPU has them) or portable.

Prefill segments (runs of tokens of one adapter) are SGMV; the decode rows of one adapter, wherever
they sit in the batch, are grouped into one BGMV item, so each adapter's ``A`` and ``B`` are read once
per step for all its rows. Long segments stay on the kernel too: at LoRA's ranks ATen's matmul
was slower in all but one case measured, from 32 to 2048 tokens (``csrc/lora.cpp``). The rows and
items are planned once per :class:`LoRABatch` (every layer of a forward shares it).

``KVSERVE_LORA_KERNEL`` picks the kernel: a path of this build (``avx512-bf16``, ``avx512``,
``portable``; default the best the CPU runs) or ``torch`` (core's PyTorch kernel), so each can be
tested and measured on one machine. Built on first use by :mod:`kvserve_cpu_native`; where it cannot
be, core's PyTorch kernel runs and the start-up log says why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from kvserve.interfaces.lora_kernel import LoRABatch, LoRAKernel
from kvserve.lora.torch_kernel import TorchLoRAKernel
from kvserve_cpu_native import unavailable_reason

logger = logging.getLogger("kvserve")

LIBRARY = "kvserve_cpu_lora"
SOURCES = (Path(__file__).parent / "csrc" / "lora.cpp",)
KERNEL_ENV = "KVSERVE_LORA_KERNEL"
NATIVE_DTYPES = (torch.float32, torch.bfloat16)


class NativeLoRAKernel(LoRAKernel):
    """:class:`LoRAKernel` through the C++ operators (built and loaded before construction) on
    ``path`` (``None``: the best this build runs); float32 and bfloat16, other dtypes on core's
    PyTorch kernel."""

    def __init__(self, path: str | None = None) -> None:
        ops = getattr(torch.ops, LIBRARY)
        self.paths: list[str] = list(ops.paths())
        """The paths this build runs, best first."""
        if path is not None and path not in self.paths:
            raise ValueError(f"LoRA kernel path {path!r} is not built here; this CPU runs {', '.join(self.paths)}")
        self.path = path or self.paths[0]
        self.name = f"cpu-native-{self.path}"
        self._shrink, self._expand, self._fused = ops.shrink.default, ops.expand.default, ops.add_lora_linear.default
        self._fallback = TorchLoRAKernel()
        self._batch: LoRABatch | None = None
        self._plan: tuple[torch.Tensor, torch.Tensor] | None = None

    def shrink(self, x: torch.Tensor, lora_a: torch.Tensor, batch: LoRABatch) -> torch.Tensor:
        if x.dtype not in NATIVE_DTYPES:
            return self._fallback.shrink(x, lora_a, batch)
        rows, items = self._rows_and_items(batch)
        return self._shrink(x, lora_a, rows, items, self.path)

    def expand(self, y: torch.Tensor, h: torch.Tensor, lora_b: Sequence[torch.Tensor], batch: LoRABatch) -> None:
        if y.dtype not in NATIVE_DTYPES:
            self._fallback.expand(y, h, lora_b, batch)
            return
        rows, items = self._rows_and_items(batch)
        self._expand(y, h, list(lora_b), rows, items, self.path)

    def add_lora_linear(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: Sequence[torch.Tensor],
        batch: LoRABatch,
        prefetch: Sequence[torch.Tensor] = (),
    ) -> None:
        """One C++ pass: each row tile's ``h`` stays in a per-thread buffer between shrink and expand;
        then the batch's slots of ``prefetch`` are brought into cache."""
        if y.dtype not in NATIVE_DTYPES:
            self._fallback.add_lora_linear(y, x, lora_a, lora_b, batch)
            return
        rows, items = self._rows_and_items(batch)
        self._fused(y, x, lora_a, lora_b, rows, items, self.path, prefetch)

    def _rows_and_items(self, batch: LoRABatch) -> tuple[torch.Tensor, torch.Tensor]:
        """``rows`` (token indices) and ``items`` (``begin, end, slot`` into ``rows``): each segment of
        two or more tokens its own item, the one-token segments grouped by slot (BGMV)."""
        if batch is not self._batch:
            rows: list[int] = []
            items: list[tuple[int, int, int]] = []
            singles: dict[int, list[int]] = {}
            for start, stop, slot in batch.segments:
                if stop - start == 1:
                    singles.setdefault(slot, []).append(start)
                elif stop > start:
                    items.append((len(rows), len(rows) + stop - start, slot))
                    rows.extend(range(start, stop))
            for slot, group in singles.items():
                items.append((len(rows), len(rows) + len(group), slot))
                rows.extend(group)
            self._plan = (torch.tensor(rows, dtype=torch.int64), torch.tensor(items, dtype=torch.int64).reshape(-1, 3))
            self._batch = batch
        return self._plan


def cpu_lora_kernel() -> LoRAKernel:
    """The kernel ``KVSERVE_LORA_KERNEL`` names, else the native one on its best path, built (or
    found in the cache) now; core's PyTorch kernel, with the reason, where the build is unavailable."""
    choice = os.environ.get(KERNEL_ENV) or None
    if choice == "torch":
        logger.info("kvserve-platform-cpu: LoRA runs core's PyTorch kernel, as %s asks", KERNEL_ENV)
        return TorchLoRAKernel()
    reason = unavailable_reason(LIBRARY, SOURCES)
    if reason is not None:
        logger.warning("kvserve-platform-cpu: native LoRA kernel unavailable, using PyTorch's: %s", reason)
        return TorchLoRAKernel()
    return NativeLoRAKernel(choice)
