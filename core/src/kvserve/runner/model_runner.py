"""Turns a step input into tensors and runs the model once for the whole mixed batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvserve.forward_context import ForwardContext, current_forward_context
from kvserve.interfaces import AttentionBackend, AttentionBatch
from kvserve.kv_cache.block_pool import NULL_BLOCK
from kvserve.lora.layers import LoRASlots
from kvserve.runner.compilation import CompiledForward
from kvserve.runner.step_buffers import StepBuffers
from kvserve.runner.step_input import StepInput
from kvserve.runner.step_logits import StepLogits


@dataclass(frozen=True)
class RunnerInfo:
    """What the driver needs to know of a runner (of every rank's, under tensor parallelism)."""

    num_kv_blocks: int
    """KV blocks of the runner's cache, the null block included."""
    block_size: int
    attention_backend: str
    """The attention backend's name."""
    linear_kernel: str
    """Which GEMM the dense linear layers run, for the start-up line."""
    layer_ops: str
    """Which norm/activation/rope kernels the layers run, for the start-up line."""
    lora_kernel: str | None = None
    """The LoRA kernel's name with LoRA on, for the start-up line; None: no LoRA slots."""
    lora_targets: dict[str, tuple[int, int]] | None = None
    """With LoRA on, what adapters may target (:attr:`~kvserve.lora.layers.LoRASlots.targets`)."""
    weight_bytes: int = 0
    """Resident bytes of the runner's model parameters as loaded (its shard's: a quantized layer's
    packed blocks, the rank's slice under tensor parallelism); buffers, LoRA slots and the KV cache
    aside."""


class ModelRunner:
    """``compiled``: run the steps it :meth:`~CompiledForward.runs` through it (bucket-padded), the
    others eagerly, unpadded; None: every step eager, unpadded.
    ``lora``: the model's LoRA slots, which each step's ``lora_loads`` fill; None without LoRA.

    Per-step inputs are written into :class:`StepBuffers` allocated once, sized for steps of
    ``max_tokens`` tokens and ``max_seqs`` sequences of up to ``max_model_len`` tokens. Build one
    with :func:`kvserve.runner.build.build_runner`.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        kv_caches: list[Any],
        info: RunnerInfo,
        device: torch.device,
        compiled: CompiledForward | None = None,
        max_tokens: int = 2048,
        max_seqs: int = 128,
        max_model_len: int = 2048,
        lora: LoRASlots | None = None,
    ) -> None:
        self.model = model
        self.lora = lora
        self.backend = backend
        self.kv_caches = kv_caches
        self.info = info
        self.device = device
        self.block_size = backend.spec.block_size
        self.compiled = compiled
        self.buffers = StepBuffers(max_tokens, max_seqs, -(-max_model_len // self.block_size), device)

    def prepare(self, step: StepInput) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch, dict[str, torch.Tensor]]:
        """Input ids, positions, the attention batch description and the per-token metadata of ``step``.

        A step the compiled forward runs has its token dimension padded to its bucket: padded tokens
        have id 0, position 0, slot -1 and metadata -1 and belong to no sequence.
        """
        bs, buf = self.block_size, self.buffers
        num_tokens, num_seqs = step.num_tokens, step.num_chunks
        padded = num_tokens if self.compiled is None else self.compiled.padded_tokens(num_tokens)
        width = max(map(len, step.block_tables))
        buf.ensure(padded, num_seqs, width)
        ids, positions, slots = buf.input_ids.host, buf.positions.host, buf.slot_mapping.host
        block_tables = buf.block_table_rows(num_seqs, width)
        for row, table in enumerate(step.block_tables):
            block_tables[row, : len(table)] = table
        query_starts, starts = step.query_start_loc, step.context_lens
        counts = np.diff(query_starts)
        ids[:num_tokens] = step.token_ids
        # Token t of sequence i sits at position starts[i] + (t - first token of i).
        rows = np.repeat(np.arange(num_seqs), counts)
        pos = positions[:num_tokens]
        pos[:] = np.arange(num_tokens) - np.repeat(query_starts[:-1] - starts, counts)
        slots[:num_tokens] = block_tables[rows, pos // bs] * bs + pos % bs
        ids[num_tokens:padded], positions[num_tokens:padded], slots[num_tokens:padded] = 0, 0, -1
        metadata = {}
        for name, values in step.token_metadata.items():
            buffer = buf.metadata(name, padded)
            buffer.host[:num_tokens] = values
            buffer.host[num_tokens:padded] = -1
            metadata[name] = buffer.to_device(padded)
        query_start_loc = query_starts.tolist()
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
        return buf.input_ids.to_device(padded), buf.positions.to_device(padded), batch, metadata

    @torch.inference_mode()
    def execute(self, step: StepInput) -> StepLogits:
        """One forward over every token of ``step``; logits of its sample positions and prompt-logit
        spans (and the sample positions' hidden states when ``step.keep_hidden_states``)."""
        if step.lora_loads:
            self.lora.load(step.lora_loads)
        hidden = self._forward(*self.prepare(step))
        samples = torch.from_numpy(step.sample_indices).to(self.device)
        sample_hidden = hidden[samples]
        logits = self.model.compute_logits(sample_hidden).float()
        prompt_logits = {
            chunk: self.model.compute_logits(hidden[first:stop]).float()
            for chunk, (first, stop) in step.prompt_logit_spans.items()
        }
        kept = sample_hidden if step.keep_hidden_states else None
        return StepLogits(logits, step.sample_start_loc, prompt_logits, kept)

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch, metadata: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """The model's hidden states of a prepared step: compiled where the compiled forward runs it."""
        ctx = ForwardContext(self.backend, batch, self.backend.build_metadata(batch), self.kv_caches, metadata)
        compiled = self.compiled is not None and self.compiled.runs(input_ids.shape[0])
        forward = self.compiled if compiled else self.model
        with current_forward_context(ctx):  # for layers the context is not passed to (linear layers)
            return forward(input_ids, positions, ctx)

    @torch.inference_mode()
    def compile_buckets(self) -> None:
        """Compile (or load from the cache) every bucket of the compiled forward now, at start-up, so
        that no step waits on a compile: each on a decode step of that many one-token sequences, which
        reads the null block and stores nothing."""
        for bucket in self.compiled.buckets:
            step = StepInput(
                token_ids=np.zeros(bucket, dtype=np.int64),
                query_start_loc=np.arange(bucket + 1, dtype=np.int64),
                context_lens=np.zeros(bucket, dtype=np.int64),
                block_tables=((NULL_BLOCK,),) * bucket,
                sample_indices=np.zeros(0, dtype=np.int64),
                sample_start_loc=np.zeros(bucket + 1, dtype=np.int64),
            )
            input_ids, positions, batch, metadata = self.prepare(step)
            batch.slot_mapping.fill_(-1)  # padding's slot: the null block is left as it was
            self._forward(input_ids, positions, batch, metadata)
