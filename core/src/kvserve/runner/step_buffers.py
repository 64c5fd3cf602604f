"""The runner's per-step input tensors, allocated once and refilled every step.

A step writes its numbers into host arrays (numpy views of CPU tensors) and, where the device
is not the CPU, copies the used prefix of each once; the CPU uses the host tensors directly.
Buffers grow (never shrink) when a step needs more than they hold.
"""

from __future__ import annotations

import numpy as np
import torch


class StepBuffer:
    """One flat buffer: ``host`` (numpy, for filling), ``host_tensor`` (its CPU tensor) and ``device``."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.target = dtype, device
        self._allocate(size)

    def _allocate(self, size: int) -> None:
        self.host_tensor = torch.zeros(size, dtype=self.dtype, device="cpu")
        self.host = self.host_tensor.numpy()
        on_host = self.target.type == "cpu"
        self.device = self.host_tensor if on_host else torch.zeros(size, dtype=self.dtype, device=self.target)

    def ensure(self, size: int) -> None:
        """Room for ``size`` entries (reallocates, contents lost, when smaller)."""
        if size > self.host.shape[0]:
            self._allocate(max(size, 2 * self.host.shape[0]))

    def to_device(self, size: int, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """The first ``size`` entries on the device (one copy unless the device is the CPU), viewed as ``shape``."""
        if self.device is not self.host_tensor:
            self.device[:size].copy_(self.host_tensor[:size], non_blocking=True)
        out = self.device[:size]
        return out if shape is None else out.view(shape)


class StepBuffers:
    """Input ids, positions, slot mapping, per-token metadata (per token); query starts, sequence
    and context lengths (per sequence); block tables (per sequence x block, contiguous for the
    step's width)."""

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, device: torch.device) -> None:
        self.input_ids = StepBuffer(max_tokens, torch.long, device)
        self.positions = StepBuffer(max_tokens, torch.long, device)
        self.slot_mapping = StepBuffer(max_tokens, torch.long, device)
        self.query_start_loc = StepBuffer(max_seqs + 1, torch.int32, device)
        self.seq_lens = StepBuffer(max_seqs, torch.int32, device)
        self.context_lens = StepBuffer(max_seqs, torch.int32, device)
        self.block_tables = StepBuffer(max_seqs * max_blocks_per_seq, torch.int32, device)
        self.token_metadata: dict[str, StepBuffer] = {}
        """Metadata name -> its per-token buffer, made at the first step that carries the name."""
        self.device = device

    def ensure(self, num_tokens: int, num_seqs: int, table_width: int) -> None:
        for buffer in (self.input_ids, self.positions, self.slot_mapping):
            buffer.ensure(num_tokens)
        for buffer in (self.query_start_loc, self.seq_lens, self.context_lens):
            buffer.ensure(num_seqs + 1)
        self.block_tables.ensure(num_seqs * table_width)

    def metadata(self, name: str, num_tokens: int) -> StepBuffer:
        """The per-token buffer of metadata ``name``, with room for ``num_tokens``."""
        buffer = self.token_metadata.get(name)
        if buffer is None:
            buffer = self.token_metadata[name] = StepBuffer(
                max(num_tokens, self.input_ids.host.shape[0]), torch.long, self.device
            )
        buffer.ensure(num_tokens)
        return buffer

    def block_table_rows(self, num_seqs: int, width: int) -> np.ndarray:
        """The host block tables of this step, ``[num_seqs, width]``, zeroed (block 0 is the null block)."""
        rows = self.block_tables.host[: num_seqs * width].reshape(num_seqs, width)
        rows.fill(0)
        return rows
