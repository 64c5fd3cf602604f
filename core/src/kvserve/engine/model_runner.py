"""Turns a step plan into tensors, runs the model once for the whole mixed batch, samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvserve.engine.compilation import CompiledForward
from kvserve.engine.step_buffers import StepBuffers
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
    """``compiled``: run the model through it (bucket-padded steps); None: eager, unpadded.

    Per-step inputs are written into :class:`StepBuffers` allocated once, sized for steps of
    ``max_tokens`` tokens and ``max_seqs`` sequences of up to ``max_model_len`` tokens.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        kv_caches: list[Any],
        kv_cache_manager: KVCacheManager,
        device: torch.device,
        compiled: CompiledForward | None = None,
        max_tokens: int = 2048,
        max_seqs: int = 128,
        max_model_len: int = 2048,
    ) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.kv_cache_manager = kv_cache_manager
        self.device = device
        self.block_size = backend.spec.block_size
        self.compiled = compiled
        self.buffers = StepBuffers(max_tokens, max_seqs, -(-max_model_len // self.block_size), device)

    def prepare(self, plan: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        """Input ids, positions and the attention batch description of ``plan``.

        Under compilation the token dimension is padded to its bucket: padded tokens have id 0,
        position 0 and slot -1 and belong to no sequence.
        """
        bs, buf = self.block_size, self.buffers
        scheduled = plan.scheduled
        tables = [self.kv_cache_manager.block_table(item.request.request_id) for item in scheduled]
        num_tokens = sum(item.num_tokens for item in scheduled)
        padded = num_tokens if self.compiled is None else self.compiled.padded_tokens(num_tokens)
        num_seqs, width = len(scheduled), max(map(len, tables))
        buf.ensure(padded, num_seqs, width)
        ids, positions, slots = buf.input_ids.host, buf.positions.host, buf.slot_mapping.host
        block_tables = buf.block_table_rows(num_seqs, width)
        for row, table in enumerate(tables):
            block_tables[row, : len(table)] = table
        counts = np.fromiter((item.num_tokens for item in scheduled), np.int64, num_seqs)
        starts = np.fromiter((item.start for item in scheduled), np.int64, num_seqs)
        ends = np.cumsum(counts)
        token_ids: list[int] = []
        for item in scheduled:
            token_ids += item.request.token_ids(item.start, item.start + item.num_tokens)
        ids[:num_tokens] = token_ids
        # Token t of sequence i sits at position starts[i] + (t - first token of i).
        rows = np.repeat(np.arange(num_seqs), counts)
        pos = positions[:num_tokens]
        pos[:] = np.arange(num_tokens) - np.repeat(ends - counts - starts, counts)
        slots[:num_tokens] = block_tables[rows, pos // bs] * bs + pos % bs
        ids[num_tokens:padded], positions[num_tokens:padded], slots[num_tokens:padded] = 0, 0, -1
        query_start_loc = [0, *ends.tolist()]
        seq_lens = (starts + counts).tolist()
        context_lens = starts.tolist()
        buf.query_start_loc.host[: num_seqs + 1] = query_start_loc
        buf.seq_lens.host[:num_seqs] = seq_lens
        buf.context_lens.host[:num_seqs] = context_lens
        # Planned on the host on purpose (no device syncs while planning), copied once per step.
        batch = AttentionBatch(
            query_start_loc=buf.query_start_loc.to_device(num_seqs + 1),
            seq_lens=buf.seq_lens.to_device(num_seqs),
            context_lens=buf.context_lens.to_device(num_seqs),
            block_tables=buf.block_tables.to_device(num_seqs * width, (num_seqs, width)),
            slot_mapping=buf.slot_mapping.to_device(padded),
            query_start_loc_host=query_start_loc,
            seq_lens_host=seq_lens,
            context_lens_host=context_lens,
            block_tables_host=block_tables,
            block_size=bs,
        )
        return buf.input_ids.to_device(padded), buf.positions.to_device(padded), batch

    @torch.inference_mode()
    def execute(self, plan: SchedulerOutput) -> StepLogits:
        """One forward over every scheduled token; logits where the plan needs them."""
        input_ids, positions, batch = self.prepare(plan)
        ctx = ForwardContext(self.backend, batch, self.backend.build_metadata(batch), self.kv_caches)
        forward = self.model if self.compiled is None else self.compiled
        hidden = forward(input_ids, positions, ctx)
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
