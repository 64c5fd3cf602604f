"""One step as plain data: the only thing a ModelRunner reads, in process and on every rank.

The driver builds it once from the scheduler's plan and the KV manager's block tables
(:meth:`StepInput.from_plan`); an executor hands it to its runner as it is, or pickles it to
every tensor-parallel worker. It holds numbers only (numpy arrays, tuples, dicts of them, the host
tensors of LoRA adapters to load), no requests and no live objects, so every rank sees exactly what
the driver planned.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvserve.interfaces import KVCacheManager, SchedulerOutput
    from kvserve.lora.layers import SlotLoad
    from kvserve.request import Request

TokenMetadataSource = Callable[["Request"], int]
"""The value every token of a request carries under one metadata name (e.g. its LoRA adapter id)."""


@dataclass(frozen=True, eq=False)
class StepInput:
    """Chunk ``i`` is ``plan.scheduled[i]``: ``query_start_loc[i+1] - query_start_loc[i]`` new
    tokens of one sequence, at positions ``context_lens[i]`` onwards. Token indices count over
    the whole step (chunk after chunk). Arrays are int64 and must not be written to."""

    token_ids: np.ndarray
    """``[num_tokens]``: every chunk's new token ids, chunk after chunk."""
    query_start_loc: np.ndarray
    """``[num_chunks + 1]``: chunk ``i``'s tokens are ``token_ids[query_start_loc[i] : query_start_loc[i + 1]]``."""
    context_lens: np.ndarray
    """``[num_chunks]``: tokens of chunk ``i``'s sequence before the chunk, i.e. its first token's position
    (token ``t`` of the chunk sits at position ``context_lens[i] + t``)."""
    block_tables: tuple[tuple[int, ...], ...]
    """Per chunk: its sequence's KV block ids in order, covering at least ``context_lens[i]`` plus the chunk."""
    sample_indices: np.ndarray
    """``[num_samples]``: the token indices whose next-token logits are wanted, grouped by chunk and
    ascending within one (today: the last token of each chunk that completes its sequence)."""
    sample_start_loc: np.ndarray
    """``[num_chunks + 1]``: chunk ``i``'s sample positions are ``sample_indices[sample_start_loc[i] :
    sample_start_loc[i + 1]]`` (none for a chunk that samples nothing)."""
    prompt_logit_spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Chunk -> token indices ``(first, stop)`` whose logits predict prompt tokens, for requests asking
    for ``prompt_logprobs`` (only chunks with at least one such token)."""
    token_metadata: dict[str, np.ndarray] = field(default_factory=dict)
    """Name -> ``[num_tokens]`` int64 values, one per token (e.g. ``"lora_id"``: the adapter of each
    token's request); the runner puts each into :attr:`~kvserve.forward_context.ForwardContext.token_metadata`."""
    keep_hidden_states: bool = False
    """Hand back the model's final hidden states of the sample positions too (a speculative-decoding
    proposer that drafts from them asked for them)."""
    lora_loads: tuple[SlotLoad, ...] = ()
    """LoRA adapters to put into slots before the forward (the host's
    :meth:`~kvserve.lora.manager.LoRAManager.activate` chose them): each rank loads its shard."""

    def __post_init__(self) -> None:
        num_chunks, num_tokens = len(self.context_lens), len(self.token_ids)
        lengths = {
            "query_start_loc": (len(self.query_start_loc), num_chunks + 1),
            "block_tables": (len(self.block_tables), num_chunks),
            "sample_start_loc": (len(self.sample_start_loc), num_chunks + 1),
            **{f"token_metadata[{name!r}]": (len(v), num_tokens) for name, v in self.token_metadata.items()},
        }
        for name, (got, wanted) in lengths.items():
            if got != wanted:
                raise ValueError(f"StepInput.{name}: {got} entries for {num_chunks} chunks of {num_tokens} tokens")
        if self.query_start_loc[-1] != num_tokens or self.sample_start_loc[-1] != len(self.sample_indices):
            raise ValueError(
                f"StepInput: query_start_loc ends at {self.query_start_loc[-1]} (tokens: {num_tokens}), "
                f"sample_start_loc at {self.sample_start_loc[-1]} (samples: {len(self.sample_indices)})"
            )

    @property
    def num_chunks(self) -> int:
        return len(self.context_lens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @classmethod
    def from_plan(
        cls,
        plan: SchedulerOutput,
        kv_cache_manager: KVCacheManager,
        token_metadata: Mapping[str, TokenMetadataSource] | None = None,
        keep_hidden_states: bool = False,
        lora_loads: tuple[SlotLoad, ...] = (),
    ) -> StepInput:
        """The step of ``plan``: block tables from ``kv_cache_manager`` (after scheduling, so they
        cover the chunks), sample positions at the last ``1 + num_lookahead`` tokens of every chunk
        that completes its sequence, and per name of ``token_metadata`` each token's value from its request;
        ``keep_hidden_states`` and ``lora_loads`` as the fields."""
        scheduled = plan.scheduled
        num_chunks = len(scheduled)
        counts = np.fromiter((item.num_tokens for item in scheduled), np.int64, num_chunks)
        query_start_loc = np.zeros(num_chunks + 1, np.int64)
        np.cumsum(counts, out=query_start_loc[1:])
        token_ids: list[int] = []
        spans: dict[int, tuple[int, int]] = {}
        for i, item in enumerate(scheduled):
            request = item.request
            token_ids += item.token_ids()  # known tokens, then any drafts to verify
            if request.sampling_params.prompt_logprobs is not None:
                # Rows predicting prompt tokens start+1 .. end of prompt, within this chunk.
                stop = min(item.start + item.num_tokens, request.num_prompt_tokens - 1)
                if stop > item.start:
                    first = int(query_start_loc[i])
                    spans[i] = (first, first + stop - item.start)
        # A chunk that completes its sequence samples its last 1 + num_lookahead positions (row j
        # verifies draft j, the last one gives the next token); other chunks sample none.
        samples = np.fromiter((item.num_sample_positions for item in scheduled), np.int64, num_chunks)
        sample_start_loc = np.zeros(num_chunks + 1, np.int64)
        np.cumsum(samples, out=sample_start_loc[1:])
        first_sample = np.repeat(query_start_loc[1:] - samples, samples)
        offsets = np.arange(int(sample_start_loc[-1])) - np.repeat(sample_start_loc[:-1], samples)
        metadata = {
            name: np.repeat(np.fromiter((source(item.request) for item in scheduled), np.int64, num_chunks), counts)
            for name, source in (token_metadata or {}).items()
        }
        return cls(
            token_ids=np.array(token_ids, dtype=np.int64),
            query_start_loc=query_start_loc,
            context_lens=np.fromiter((item.start for item in scheduled), np.int64, num_chunks),
            block_tables=tuple(tuple(kv_cache_manager.block_table(item.request.request_id)) for item in scheduled),
            sample_indices=first_sample + offsets,
            sample_start_loc=sample_start_loc,
            prompt_logit_spans=spans,
            token_metadata=metadata,
            keep_hidden_states=keep_hidden_states,
            lora_loads=lora_loads,
        )
