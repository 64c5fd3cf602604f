"""TritonLoRAKernel: the LoRAKernel of the CUDA platform, SGMV and BGMV in Triton."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvserve.interfaces.lora_kernel import LoRABatch, LoRAKernel
from kvserve_platform_cuda.lora.common import SEGMENT_TILE
from kvserve_platform_cuda.lora.expand import expand, slice_table
from kvserve_platform_cuda.lora.shrink import shrink


class TritonLoRAKernel(LoRAKernel):
    """Segments of two or more tokens run SGMV: a program per (tile of up to ``SEGMENT_TILE`` tokens of
    one segment, column block), a matrix product with the segment's slot. One-token segments (decode
    rows) run BGMV: a program per (row, column block), a vector-matrix product with the row's slot.
    Each is one launch per shrink and per expand, every output slice of a packed layer in the same
    expand. Base tokens are in no tile and no row: never read or written.

    The tiles are planned on the host once per :class:`LoRABatch` (the layers of a forward share it).
    """

    name = "triton"

    def __init__(self) -> None:
        self._batch: LoRABatch | None = None
        self._tiles: torch.Tensor | None = None
        self._slice_tables: dict[tuple, torch.Tensor] = {}

    def shrink(self, x: torch.Tensor, lora_a: torch.Tensor, batch: LoRABatch) -> torch.Tensor:
        if x.dtype != lora_a.dtype:
            raise ValueError(f"LoRA shrink: x is {x.dtype} but lora_a is {lora_a.dtype}; both must be the model dtype")
        h = x.new_empty(x.shape[0], lora_a.shape[2])
        shrink(x, lora_a, h, self._segment_tiles(batch), batch.single_rows, batch.single_slots)
        return h

    def expand(self, y: torch.Tensor, h: torch.Tensor, lora_b: Sequence[torch.Tensor], batch: LoRABatch) -> None:
        rank = lora_b[0].shape[1]
        if any(b.shape[1] != rank for b in lora_b) or h.shape[1] != len(lora_b) * rank:
            raise ValueError(
                f"LoRA expand: every slice's lora_b must have the rank h is cut into; got ranks "
                f"{[b.shape[1] for b in lora_b]} for h of {h.shape[1]} columns"
            )
        if any(b.dtype != y.dtype for b in lora_b) or h.dtype != y.dtype:
            raise ValueError(
                f"LoRA expand: y is {y.dtype}, h {h.dtype}, lora_b {[b.dtype for b in lora_b]}; "
                "all must be the model dtype"
            )
        table = self._slice_table(lora_b, y.device)
        widest = max(b.shape[2] for b in lora_b)
        expand(y, h, table, rank, widest, self._segment_tiles(batch), batch.single_rows, batch.single_slots)

    def _segment_tiles(self, batch: LoRABatch) -> torch.Tensor:
        """int64 ``[n, 3]`` (``start, stop, slot``) on the device: the segments of two or more tokens cut
        into tiles of at most ``SEGMENT_TILE``; empty and one-token segments are in none."""
        if batch is not self._batch:
            tiles = [
                (first, min(first + SEGMENT_TILE, stop), slot)
                for start, stop, slot in batch.segments
                if stop - start > 1
                for first in range(start, stop, SEGMENT_TILE)
            ]
            device = batch.token_slots.device
            self._tiles = torch.tensor(tiles, dtype=torch.int64, device=device).reshape(-1, 3)
            self._batch = batch
        return self._tiles

    def _slice_table(self, lora_b: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
        """The layer's slice table, built at its first expand: its slots are written in place when
        adapters load, so addresses and strides, all the table holds, stay."""
        key = (device, *((b.data_ptr(), tuple(b.shape), b.stride()) for b in lora_b))
        table = self._slice_tables.get(key)
        if table is None:
            table = self._slice_tables[key] = slice_table(lora_b, device)
        return table
