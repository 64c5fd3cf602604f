"""The ``draft_model`` proposer: a smaller model sharing the target's vocabulary guesses the next
tokens, greedily, ``k`` forward passes per engine step (vLLM's ``method: draft_model``).

The draft runs on the engine's platform through the core's own runner (:func:`build_runner`) over a
paged KV cache of its own (the configured KV cache manager, prefix caching off). Each request's
draft sequence is its tokens followed by the drafts of the last step; the next step keeps the KV of
the longest common prefix with the request's tokens (the accepted drafts) and computes only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from kvserve import components
from kvserve.config import SpeculativeConfig
from kvserve.errors import ConfigError
from kvserve.interfaces import KVCacheManager
from kvserve.interfaces.proposer import DraftProposer, DraftRequest, TargetModel
from kvserve.request import Request
from kvserve.runner.model_runner import ModelRunner
from kvserve.runner.step_input import StepInput
from kvserve.sampling_params import SamplingParams


class DraftModelOptions(BaseModel):
    """The ``draft_model`` method's ``speculative_config`` fields, with vLLM's names."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: str = Field(
        description="The draft model: a local HF directory or .gguf file sharing the target's vocabulary"
    )
    quantization: str = Field("auto", description="The draft's quantization method, as the engine's field")
    max_model_len: PositiveInt | None = Field(
        None, description="The draft's longest sequence; None: the engine's max_model_len"
    )


class DraftModelProposer(DraftProposer):
    """Greedy drafts of a second model, with its own runner and KV cache (built by :meth:`attach`)."""

    name = "draft_model"
    options = DraftModelOptions

    def __init__(self, config: SpeculativeConfig, vocab_size: int) -> None:
        super().__init__(config, vocab_size)
        self.runner: ModelRunner | None = None
        self.kv: KVCacheManager | None = None
        self.sequences: dict[str, Request] = {}
        """Request id -> its draft sequence: the request's tokens, then the drafts last proposed."""

    def attach(self, target: TargetModel) -> None:
        from kvserve.loader import open_model
        from kvserve.runner.build import build_runner
        from kvserve.runner.model_settings import ModelSettings

        o: DraftModelOptions = self.method_options
        if target.config.parallel.tensor_parallel_size > 1:
            raise ConfigError("speculative_config: method 'draft_model' does not run under tensor parallelism yet")
        source = open_model(o.model)
        draft_vocab = source.hf_config.vocab_size
        if draft_vocab != self.vocab_size:
            raise ConfigError(
                f"speculative_config.model: the draft {source.path} has a vocabulary of {draft_vocab} tokens, "
                f"the target {target.model_path} one of {self.vocab_size}: they must share it"
            )
        engine = target.config
        config = engine.model_copy(
            update={
                "model": engine.model.model_copy(
                    update={
                        "model": o.model,
                        "tokenizer": None,
                        "max_model_len": o.max_model_len or target.max_model_len,
                    }
                ),
                "quantization": engine.quantization.model_copy(update={"quantization": o.quantization}),
                "cache": engine.cache.model_copy(update={"enable_prefix_caching": False}),
                # The draft proposes as the base model: no LoRA slots (the target verifies with the adapters).
                "lora": engine.lora.model_copy(update={"enable_lora": False}),
            }
        )
        settings = ModelSettings.resolve(config, target.platform, source.hf_config)
        self.runner = build_runner(config, target.platform, source, settings)
        _, manager_cls = components.resolve_policy_components(config)
        self.kv = manager_cls(self.runner.info.num_kv_blocks, self.runner.info.block_size, False)
        self.max_tokens, self.max_seqs = engine.scheduler.max_num_batched_tokens, engine.scheduler.max_num_seqs
        self.max_model_len = settings.max_model_len

    def forget(self, request_id: str) -> None:
        sequence = self.sequences.pop(request_id, None)
        if sequence is not None:
            self.kv.free(sequence)

    def propose(self, requests: Sequence[DraftRequest], num_tokens: Sequence[int]) -> list[list[int]]:
        if self.runner is None:
            raise RuntimeError("draft_model: attach() builds the draft model before the first proposal")
        drafts: list[list[int]] = [[] for _ in requests]
        # The requests whose draft sequence holds their tokens, with room for their drafts.
        active = [i for i, k in enumerate(num_tokens) if k > 0 and self._sync(requests[i], k)]
        while active:
            for i, token in self._forward([self.sequences[requests[i].request_id] for i in active]).items():
                drafts[active[i]].append(token)
                self.sequences[requests[active[i]].request_id].output_token_ids.append(token)
            active = [i for i in active if len(drafts[i]) < num_tokens[i]]
        return drafts

    def _sync(self, request: DraftRequest, k: int) -> bool:
        """Bring the draft sequence to the request's tokens (KV kept for the common prefix) with
        room for ``k`` drafts; False (and nothing held) when it does not fit."""
        tokens_len = len(request.prompt_token_ids) + len(request.output_token_ids)
        if tokens_len + k > self.max_model_len:
            self.forget(request.request_id)
            return False
        sequence = self.sequences.get(request.request_id)
        if sequence is None:
            sequence = self.sequences[request.request_id] = Request(
                request.request_id, list(request.prompt_token_ids), SamplingParams()
            )
        if sequence.num_prompt_tokens != len(request.prompt_token_ids):
            self.forget(request.request_id)
            return self._sync(request, k)
        output = request.output_token_ids
        ours = sequence.output_token_ids
        common = 0
        while common < min(len(ours), len(output)) and ours[common] == output[common]:
            common += 1
        sequence.output_token_ids = list(output)
        computed = min(sequence.num_computed_tokens, sequence.num_prompt_tokens + common, tokens_len - 1)
        if computed < sequence.num_computed_tokens:
            sequence.num_computed_tokens = computed
            self.kv.truncate(sequence, computed)
        # Slots for the rest of its tokens and the k - 1 drafts that get computed.
        needed = tokens_len + k - 1 - sequence.num_computed_tokens
        if not self.kv.allocate_slots(sequence, needed):
            self.forget(request.request_id)
            return False
        return True

    def _forward(self, sequences: list[Request]) -> dict[int, int]:
        """Compute every sequence's uncomputed tokens, within the runner's token and sequence
        limits (several passes if need be); the greedy next token of each, by index."""
        pending = {i: s.num_tokens - s.num_computed_tokens for i, s in enumerate(sequences)}
        nexts: dict[int, int] = {}
        while pending:
            chunks: list[tuple[int, int]] = []  # (index, tokens this pass)
            budget = self.max_tokens
            for i, left in pending.items():
                if budget == 0 or len(chunks) == self.max_seqs:
                    break
                chunks.append((i, min(left, budget)))
                budget -= chunks[-1][1]
            step = self._step_input([(sequences[i], n, n == pending[i]) for i, n in chunks])
            logits = self.runner.execute(step).logits
            greedy = torch.argmax(logits, dim=-1).tolist()
            samples = iter(greedy)
            for i, n in chunks:
                sequences[i].num_computed_tokens += n
                if n == pending[i]:
                    nexts[i] = next(samples)
                    del pending[i]
                else:
                    pending[i] -= n
        return nexts

    def _step_input(self, chunks: list[tuple[Request, int, bool]]) -> StepInput:
        """One pass: ``n`` tokens of each sequence from its first uncomputed one, its last token
        sampled when ``samples``."""
        counts = np.array([n for _, n, _ in chunks], np.int64)
        query_start_loc = np.zeros(len(chunks) + 1, np.int64)
        np.cumsum(counts, out=query_start_loc[1:])
        sampled = np.array([s for _, _, s in chunks], np.int64)
        sample_start_loc = np.zeros(len(chunks) + 1, np.int64)
        np.cumsum(sampled, out=sample_start_loc[1:])
        token_ids = [
            t for seq, n, _ in chunks for t in seq.token_ids(seq.num_computed_tokens, seq.num_computed_tokens + n)
        ]
        return StepInput(
            token_ids=np.array(token_ids, np.int64),
            query_start_loc=query_start_loc,
            context_lens=np.array([seq.num_computed_tokens for seq, _, _ in chunks], np.int64),
            block_tables=tuple(tuple(self.kv.block_table(seq.request_id)) for seq, _, _ in chunks),
            sample_indices=(query_start_loc[1:] - 1)[sampled.astype(bool)],
            sample_start_loc=sample_start_loc,
        )
