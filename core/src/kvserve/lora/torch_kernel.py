"""Core's LoRA kernel in PyTorch: the reference every platform's kernel is checked against."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvserve.interfaces.lora_kernel import LoRABatch, LoRAKernel


class TorchLoRAKernel(LoRAKernel):
    """SGMV over segments of two or more tokens (one matmul per prefill chunk, on views of ``x``),
    BGMV over the one-token segments (decode rows: their adapters' matrices gathered, one batched
    matmul). Base tokens are never touched."""

    name = "torch"

    def shrink(self, x: torch.Tensor, lora_a: torch.Tensor, batch: LoRABatch) -> torch.Tensor:
        h = x.new_empty(x.shape[0], lora_a.shape[2])
        for start, stop, slot in batch.segments:
            if stop - start > 1:
                torch.matmul(x[start:stop], lora_a[slot], out=h[start:stop])
        rows = batch.single_rows
        if rows.numel():
            h[rows] = torch.bmm(x[rows].unsqueeze(1), lora_a[batch.single_slots]).squeeze(1)
        return h

    def expand(self, y: torch.Tensor, h: torch.Tensor, lora_b: Sequence[torch.Tensor], batch: LoRABatch) -> None:
        rows = batch.single_rows
        offset = 0
        for index, b in enumerate(lora_b):
            rank, width = b.shape[1], b.shape[2]
            y_slice, h_slice = y[:, offset : offset + width], h[:, index * rank : (index + 1) * rank]
            for start, stop, slot in batch.segments:
                if stop - start > 1:
                    y_slice[start:stop].addmm_(h_slice[start:stop], b[slot])
            if rows.numel():
                delta = torch.bmm(h_slice[rows].unsqueeze(1), b[batch.single_slots]).squeeze(1)
                y_slice.index_add_(0, rows, delta)
            offset += width
