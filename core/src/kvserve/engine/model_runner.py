"""Turns a step plan into tensors, runs the model once for the whole mixed batch, samples."""

from __future__ import annotations

import numpy as np
import torch

from kvserve.engine.sampler import Sampler
from kvserve.forward_context import ForwardContext
from kvserve.interfaces import AttentionBackend, AttentionBatch, KVCacheManager, SchedulerOutput


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        kv_caches: list[torch.Tensor],
        kv_cache_manager: KVCacheManager,
        sampler: Sampler,
        device: torch.device,
    ) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.kv_cache_manager = kv_cache_manager
        self.sampler = sampler
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
            block_size=bs,
        )
        return to_device(token_ids, torch.long), to_device(np.concatenate(positions), torch.long), batch

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> list[int]:
        """One forward over every scheduled token; a sampled token per scheduled request
        (-1 for a prefill chunk that does not reach the end of its sequence)."""
        input_ids, positions, batch = self.prepare(plan)
        ctx = ForwardContext(self.backend, batch, self.backend.build_metadata(batch), self.kv_caches)
        hidden = self.model(input_ids, positions, ctx)
        # Only chunks that reach the end of their sequence sample; a partial prefill must not
        # consume a seeded request's random numbers.
        rows = [i for i, item in enumerate(plan.scheduled) if item.completes_sequence]
        sampled = [-1] * len(plan.scheduled)
        if rows:
            last_tokens = torch.as_tensor([batch.query_start_loc_host[i + 1] - 1 for i in rows], device=self.device)
            logits = self.model.compute_logits(hidden[last_tokens]).float()
            requests = [plan.scheduled[i].request for i in rows]
            tokens = self.sampler(logits, [r.request_id for r in requests], [r.sampling_params for r in requests])
            for i, token in zip(rows, tokens):
                sampled[i] = token
        return sampled
