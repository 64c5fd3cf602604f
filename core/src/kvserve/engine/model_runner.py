"""Turns a step plan into tensors, runs the model once for the whole mixed batch, samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvserve.forward_context import ForwardContext
from kvserve.interfaces import AttentionBackend, AttentionBatch, KVCacheManager, SchedulerOutput


@dataclass
class StepLogits:
    """What one forward produced for the engine to sample from."""

    completing: list[int]
    """Indices into ``plan.scheduled`` whose chunk reaches the end of the sequence."""
    logits: torch.Tensor
    """float32 ``[len(completing), vocab]``: next-token logits of those requests."""
    prompt_logits: dict[int, torch.Tensor]
    """Index into ``plan.scheduled`` -> logits of the chunk's positions that predict prompt tokens
    (only for requests asking for ``prompt_logprobs``)."""


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        kv_caches: list[Any],
        kv_cache_manager: KVCacheManager,
        device: torch.device,
    ) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.kv_cache_manager = kv_cache_manager
        self.device = device
        self.block_size = backend.spec.block_size

    def prepare(self, plan: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        """Input ids, positions and the attention batch description of ``plan``."""
        bs = self.block_size
        token_ids: list[int] = []
        positions, slots = [], []
        query_start_loc, seq_lens, context_lens, tables = [0], [], [], []
        for item in plan.scheduled:
            start, end = item.start, item.start + item.num_tokens
            token_ids += item.request.token_ids(start, end)
            table = np.asarray(self.kv_cache_manager.block_table(item.request.request_id), dtype=np.int64)
            pos = np.arange(start, end, dtype=np.int64)
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            query_start_loc.append(query_start_loc[-1] + item.num_tokens)
            seq_lens.append(end)
            context_lens.append(start)
            tables.append(table)
        block_tables = np.zeros((len(tables), max(len(t) for t in tables)), dtype=np.int32)
        for row, table in enumerate(tables):
            block_tables[row, : len(table)] = table

        def to_device(array, dtype):
            return torch.as_tensor(array, dtype=dtype).to(self.device, non_blocking=True)

        batch = AttentionBatch(
            query_start_loc=to_device(query_start_loc, torch.int32),
            seq_lens=to_device(seq_lens, torch.int32),
            context_lens=to_device(context_lens, torch.int32),
            block_tables=to_device(block_tables, torch.int32),
            slot_mapping=to_device(np.concatenate(slots), torch.int64),
            query_start_loc_host=query_start_loc,
            seq_lens_host=seq_lens,
            context_lens_host=context_lens,
            block_tables_host=block_tables,
            block_size=bs,
        )
        return to_device(token_ids, torch.long), to_device(np.concatenate(positions), torch.long), batch

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> StepLogits:
        """One forward over every scheduled token; logits where the plan needs them."""
        input_ids, positions, batch = self.prepare(plan)
        ctx = ForwardContext(self.backend, batch, self.backend.build_metadata(batch), self.kv_caches)
        hidden = self.model(input_ids, positions, ctx)
        starts = batch.query_start_loc_host
        # Only chunks that reach the end of their sequence sample: a partial prefill must not
        # consume a seeded request's random numbers.
        completing = [i for i, item in enumerate(plan.scheduled) if item.completes_sequence]
        last_tokens = torch.tensor([starts[i + 1] - 1 for i in completing], dtype=torch.long, device=self.device)
        logits = self.model.compute_logits(hidden[last_tokens]).float()
        prompt_logits = {}
        for i, item in enumerate(plan.scheduled):
            request = item.request
            if request.sampling_params.prompt_logprobs is None:
                continue
            # Rows predicting prompt tokens start+1 .. end of prompt, within this chunk.
            stop = min(item.start + item.num_tokens, request.num_prompt_tokens - 1)
            if stop > item.start:
                rows = hidden[starts[i] : starts[i] + stop - item.start]
                prompt_logits[i] = self.model.compute_logits(rows).float()
        return StepLogits(completing, logits, prompt_logits)

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy whole KV blocks ``src -> dst`` in every layer (copy-on-write of a shared block)."""
        if not pairs:
            return
        src = torch.tensor([p[0] for p in pairs], dtype=torch.int64, device=self.device)
        dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64, device=self.device)
        self.backend.copy_blocks(self.kv_caches, src, dst)
