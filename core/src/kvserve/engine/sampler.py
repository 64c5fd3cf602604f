"""Batched sampling: one pass over the batch's logits for every SamplingParams feature.

Per-request Python runs only for features that are per-request by nature (logits
processors, bad-word prefixes); everything else is tensor ops over the whole batch.
"""

from __future__ import annotations

import inspect
from collections import Counter
from dataclasses import dataclass

import torch

from kvserve.outputs import Logprob, TokenLogprobs
from kvserve.request import Request


@dataclass
class SamplerOutput:
    tokens: list[int]
    logprobs: list[TokenLogprobs] | None
    """Per row, when any row asked for logprobs: its top-N plus the chosen token."""


class Sampler:
    """Picks one token per row. A seeded request draws from its own generator, so it samples
    the same tokens whatever else is in the batch."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.request_generators: dict[str, torch.Generator] = {}
        self._bad_word_ids: dict[str, list[list[int]]] = {}

    def forget(self, request_id: str) -> None:
        self.request_generators.pop(request_id, None)
        self._bad_word_ids.pop(request_id, None)

    def __call__(self, logits: torch.Tensor, requests: list[Request], tokenizer=None) -> SamplerOutput:
        """``logits``: float32 ``[rows, vocab]``, row ``i`` belonging to ``requests[i]``."""
        raw_logprobs = None
        if any(r.sampling_params.logprobs is not None for r in requests):
            raw_logprobs = logits.log_softmax(dim=-1)  # reported logprobs are the model's, before processing
        logits = self._process(logits.clone(), requests, tokenizer)
        params = [r.sampling_params for r in requests]
        tokens = logits.argmax(dim=-1)
        greedy = torch.tensor([p.greedy for p in params])
        if not greedy.all():
            rows = (~greedy).nonzero().squeeze(1)
            tokens[rows] = self._sample(logits[rows], [requests[i] for i in rows.tolist()])
        token_list = tokens.tolist()
        logprobs = None
        if raw_logprobs is not None:
            logprobs = top_logprobs(raw_logprobs, tokens, [r.sampling_params.logprobs or 0 for r in requests])
        return SamplerOutput(token_list, logprobs)

    def _process(self, logits: torch.Tensor, requests: list[Request], tokenizer) -> torch.Tensor:
        """Logits processors, bans, biases and penalties, in vLLM's order, before temperature."""
        for row, request in enumerate(requests):
            params = request.sampling_params
            for processor in params.logits_processors:
                logits[row] = _call_processor(processor, request, logits[row])
            if params.allowed_token_ids is not None:
                allowed = torch.full_like(logits[row], float("-inf"))
                allowed[params.allowed_token_ids] = 0.0
                logits[row] += allowed
            banned = self._banned_tokens(request, tokenizer)
            if banned:
                logits[row, banned] = float("-inf")
            if params.logit_bias:
                ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
                logits[row, ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype)
        if any(r.sampling_params.uses_penalties for r in requests):
            logits = _apply_penalties(logits, requests)
        return logits

    def _banned_tokens(self, request: Request, tokenizer) -> list[int]:
        """EOS/stop tokens before ``min_tokens``, and the token completing any bad word."""
        params = request.sampling_params
        banned: list[int] = []
        if len(request.output_token_ids) < params.min_tokens:
            banned += params.stop_token_ids + ([] if params.ignore_eos else list(request.eos_token_ids))
        if params.bad_words and tokenizer is not None:
            words = self._bad_word_ids.get(request.request_id)
            if words is None:
                words = self._bad_word_ids[request.request_id] = _bad_word_token_ids(params.bad_words, tokenizer)
            output = request.output_token_ids
            for word in words:
                prefix = word[:-1]
                if not prefix or output[len(output) - len(prefix) :] == prefix:
                    banned.append(word[-1])
        return banned

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """Temperature, top-k, top-p and min-p, then one draw per row (exponential race == multinomial).

        When every row has a top-k, the work happens on the ``max(top_k)`` best candidates only:
        no full-vocabulary sort, and random numbers only for those candidates.
        """
        params = [r.sampling_params for r in requests]
        vocab = logits.shape[1]
        logits = logits / torch.tensor([p.temperature for p in params], dtype=logits.dtype).unsqueeze(1)
        top_k = torch.tensor([p.top_k or vocab for p in params]).clamp(max=vocab)
        top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype).unsqueeze(1)
        width = int(top_k.max())
        if width < vocab:
            candidates, candidate_ids = logits.topk(width, dim=-1)
        elif (top_p < 1).any():
            candidates, candidate_ids = logits.sort(dim=-1, descending=True)
        else:
            candidates, candidate_ids = logits, None
        if candidate_ids is not None:  # sorted, best first
            drop = torch.arange(candidates.shape[1]).unsqueeze(0) >= top_k.unsqueeze(1)
            probs = candidates.masked_fill(drop, float("-inf")).softmax(dim=-1)
            # keep the smallest prefix whose mass reaches top_p (the top token is always kept)
            drop |= (probs.cumsum(dim=-1) - probs) >= top_p
            candidates = candidates.masked_fill(drop, float("-inf"))
        probs = candidates.softmax(dim=-1)
        min_p = torch.tensor([p.min_p for p in params], dtype=logits.dtype).unsqueeze(1)
        if (min_p > 0).any():
            probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
        choice = (probs / self._exponential_noise(probs, requests)).argmax(dim=-1)
        return choice if candidate_ids is None else candidate_ids.gather(1, choice.unsqueeze(1)).squeeze(1)

    def _exponential_noise(self, probs: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        noise = torch.empty_like(probs)
        unseeded = [row for row, r in enumerate(requests) if r.sampling_params.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), probs.shape[1]).exponential_(generator=self.generator)
        for row, request in enumerate(requests):
            seed = request.sampling_params.seed
            if seed is not None:
                gen = self.request_generators.get(request.request_id)
                if gen is None:
                    gen = self.request_generators[request.request_id] = torch.Generator().manual_seed(seed)
                noise[row].exponential_(generator=gen)
        return noise


def top_logprobs(logprobs: torch.Tensor, targets: torch.Tensor, top_ns: list[int]) -> list[TokenLogprobs]:
    """Per row of ``logprobs`` (log-softmaxed): ``targets[row]``'s logprob and rank plus the top ``top_ns[row]``."""
    chosen = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1)
    ranks = (logprobs > chosen.unsqueeze(1)).sum(dim=-1) + 1
    widest = max(top_ns, default=0)
    top_values, top_ids = logprobs.topk(widest, dim=-1) if widest else (None, None)
    result = []
    for row, top_n in enumerate(top_ns):
        entry = {int(targets[row]): Logprob(float(chosen[row]), int(ranks[row]))}
        for rank in range(top_n):
            entry.setdefault(int(top_ids[row, rank]), Logprob(float(top_values[row, rank]), rank + 1))
        result.append(entry)
    return result


def _call_processor(processor, request: Request, row: torch.Tensor) -> torch.Tensor:
    if len(inspect.signature(processor).parameters) == 3:
        return processor(request.prompt_token_ids, list(request.output_token_ids), row)
    return processor(list(request.output_token_ids), row)


def _apply_penalties(logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """Repetition penalty over prompt + output (HF semantics); presence/frequency over output (OpenAI).

    Works on the tokens each row has seen, never on a ``[rows, vocab]`` scratch tensor.
    """
    rows = [i for i, r in enumerate(requests) if r.sampling_params.uses_penalties]
    seen_ids, repetition, output_ids, output_adjust = [], [], [], []
    for row in rows:
        request = requests[row]
        params = request.sampling_params
        seen_ids.append(request.prompt_token_ids + request.output_token_ids)
        repetition.append(params.repetition_penalty)
        counts = Counter(request.output_token_ids)
        output_ids.append(list(counts) or [0])
        output_adjust.append([params.frequency_penalty * c + params.presence_penalty for c in counts.values()] or [0.0])
    index = torch.tensor(rows)
    sub = logits[index]
    ids = _padded(seen_ids)
    seen = sub.gather(1, ids)
    penalty = torch.tensor(repetition).unsqueeze(1)
    sub.scatter_(1, ids, torch.where(seen > 0, seen / penalty, seen * penalty))  # repeats write equal values
    sub.scatter_add_(1, _padded(output_ids), -_padded(output_adjust, fill=0.0))
    logits[index] = sub
    return logits


def _padded(lists: list[list], fill=None) -> torch.Tensor:
    """Rows of unequal length as one tensor, padded with ``fill`` (default: the row's first item)."""
    width = max(len(values) for values in lists)
    return torch.tensor([values + [values[0] if fill is None else fill] * (width - len(values)) for values in lists])


def _bad_word_token_ids(words: list[str], tokenizer) -> list[list[int]]:
    """Each bad word as tokens, alone and after a space (as it appears mid-sentence)."""
    sequences = []
    for word in words:
        for variant in (word, " " + word.lstrip()):
            ids = tokenizer.encode(variant, add_special_tokens=False)
            if ids and ids not in sequences:
                sequences.append(ids)
    return sequences
