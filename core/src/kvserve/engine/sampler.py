"""Batched sampling: one pass over the batch's logits for every SamplingParams feature.

Per-request Python runs only for features that are per-request by nature (logits
processors, bans, biases); a failure there belongs to that request alone and is reported
for its row, the other rows are sampled as usual. Everything else is tensor ops over the
whole batch, each tensor on the logits' device.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from dataclasses import dataclass, field

import torch

from kvserve.outputs import Logprob, TokenLogprobs
from kvserve.request import Request


@dataclass
class SamplerOutput:
    tokens: list[int]
    """Per row; meaningless for the rows in ``errors``."""
    logprobs: list[TokenLogprobs] | None
    """Per row, when any row asked for logprobs: its top-N plus the chosen token."""
    errors: dict[int, str] = field(default_factory=dict)
    """Row -> what failed while processing that row's logits (its request must be failed)."""


class Sampler:
    """Picks one token per row.

    A seeded request draws its noise from its own generator, over the whole vocabulary in
    token-id order, every step it samples: its tokens do not depend on what else is in the
    batch (how wide the batch's top-k is, whether columns were sorted, how many rows).
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self.request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        """Drop what is kept for ``request_id`` (its generator) once it has finished."""
        self.request_generators.pop(request_id, None)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
        """``logits``: float32 ``[rows, vocab]``, row ``i`` belonging to ``requests[i]``."""
        raw_logprobs = None
        if any(r.sampling_params.logprobs is not None for r in requests):
            raw_logprobs = logits.log_softmax(dim=-1)  # reported logprobs are the model's, before processing
        logits, errors = self._process(logits.clone(), requests)
        tokens = logits.argmax(dim=-1)
        sampled = [i for i, r in enumerate(requests) if not r.sampling_params.greedy and i not in errors]
        if sampled:
            rows = torch.tensor(sampled, device=logits.device)
            tokens[rows] = self._sample(logits[rows], [requests[i] for i in sampled])
        logprobs = None
        if raw_logprobs is not None:
            logprobs = top_logprobs(raw_logprobs, tokens, [r.sampling_params.logprobs or 0 for r in requests])
        return SamplerOutput(tokens.tolist(), logprobs, errors)

    def _process(self, logits: torch.Tensor, requests: list[Request]) -> tuple[torch.Tensor, dict[int, str]]:
        """Logits processors, allowed tokens, bans and biases row by row, then penalties, in vLLM's
        order, before temperature; returns the logits and the rows that failed."""
        errors = {}
        for row, request in enumerate(requests):
            try:
                _process_row(logits, row, request)
            except Exception as exc:  # the request's own code or data: fail it, not the batch
                errors[row] = f"processing the logits failed: {type(exc).__name__}: {exc}"
        if any(r.sampling_params.uses_penalties for r in requests):
            logits = _apply_penalties(logits, requests)
        return logits, errors

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """Temperature, then top-k, top-p and min-p as a mask, then one draw per row.

        The draw is the exponential race ``argmax(p / E)`` written as ``argmax(z - log E)``
        (``z`` the scaled logits): the normalizer is the same for every column, so no softmax
        and nothing that depends on the batch enters the choice.
        """
        params = [r.sampling_params for r in requests]
        device = logits.device
        temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=device)
        scaled = logits / temperature.unsqueeze(1)
        keep = _filter_mask(scaled, params)
        scores = scaled - self._exponential_noise(scaled.shape, requests, device).log()
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        return scores.argmax(dim=-1)

    def _exponential_noise(self, shape: torch.Size, requests: list[Request], device: torch.device) -> torch.Tensor:
        noise = torch.empty(shape, device=device)
        unseeded = [row for row, r in enumerate(requests) if r.sampling_params.seed is None]
        if unseeded:
            draws = torch.empty(len(unseeded), shape[1], device=device).exponential_(generator=self._generator(device))
            noise[torch.tensor(unseeded, device=device)] = draws
        for row, request in enumerate(requests):
            seed = request.sampling_params.seed
            if seed is not None:
                gen = self.request_generators.get(request.request_id)
                if gen is None:
                    gen = self.request_generators[request.request_id] = torch.Generator(device=device).manual_seed(seed)
                noise[row].exponential_(generator=gen)
        return noise

    def _generator(self, device: torch.device) -> torch.Generator:
        """The shared generator of unseeded requests on ``device``, seeded from the engine seed."""
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return gen


def _filter_mask(scaled: torch.Tensor, params: list) -> torch.Tensor | None:
    """``[rows, vocab]`` True where top-k, top-p and min-p keep a token (token-id order); None: all kept."""
    rows, vocab = scaled.shape
    device = scaled.device
    top_k = [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in params]
    filtered = [i for i, p in enumerate(params) if top_k[i] < vocab or p.top_p < 1.0]
    keep = None
    if filtered:
        # Only the rows that filter, over the widest candidate set they need (all, for top-p).
        width = vocab if any(params[i].top_p < 1.0 for i in filtered) else max(top_k[i] for i in filtered)
        values, ids = scaled[torch.tensor(filtered, device=device)].topk(width, dim=-1)  # best first
        k = torch.tensor([top_k[i] for i in filtered], device=device).unsqueeze(1)
        drop = torch.arange(width, device=device).unsqueeze(0) >= k
        top_p = torch.tensor([params[i].top_p for i in filtered], dtype=scaled.dtype, device=device).unsqueeze(1)
        if (top_p < 1.0).any():
            probs = values.masked_fill(drop, float("-inf")).softmax(dim=-1)
            # keep the smallest prefix whose mass reaches top_p (the top token is always kept)
            drop |= (probs.cumsum(dim=-1) - probs) >= top_p
        kept = torch.zeros(len(filtered), vocab, dtype=torch.bool, device=device).scatter_(1, ids, ~drop)
        keep = torch.ones(rows, vocab, dtype=torch.bool, device=device)
        keep[torch.tensor(filtered, device=device)] = kept
    if any(p.min_p > 0.0 for p in params):
        # p < min_p * p_max  <=>  z < z_max + log(min_p), on the scaled logits (log 0 = -inf keeps all)
        log_min_p = torch.tensor([math.log(p.min_p) if p.min_p > 0 else -math.inf for p in params], device=device)
        above = scaled >= scaled.max(dim=-1, keepdim=True).values + log_min_p.unsqueeze(1)
        keep = above if keep is None else keep & above
    return keep


def _process_row(logits: torch.Tensor, row: int, request: Request) -> None:
    params = request.sampling_params
    for processor in params.logits_processors:
        logits[row] = _call_processor(processor, request, logits[row])
    if params.allowed_token_ids is not None:
        allowed = torch.full_like(logits[row], float("-inf"))
        allowed[params.allowed_token_ids] = 0.0
        logits[row] += allowed
    banned = _banned_tokens(request)
    if banned:
        logits[row, banned] = float("-inf")
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long, device=logits.device)
        logits[row, ids] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype, device=logits.device)


def _banned_tokens(request: Request) -> list[int]:
    """EOS/stop tokens before ``min_tokens``, and the token completing any bad word."""
    params = request.sampling_params
    banned: list[int] = []
    if len(request.output_token_ids) < params.min_tokens:
        banned += params.stop_token_ids + ([] if params.ignore_eos else list(request.eos_token_ids))
    output = request.output_token_ids
    for word in request.bad_words_token_ids:
        prefix = word[:-1]
        if not prefix or output[len(output) - len(prefix) :] == prefix:
            banned.append(word[-1])
    return banned


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
    device = logits.device
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
    index = torch.tensor(rows, device=device)
    sub = logits[index]
    ids = _padded(seen_ids, device)
    seen = sub.gather(1, ids)
    penalty = torch.tensor(repetition, device=device).unsqueeze(1)
    sub.scatter_(1, ids, torch.where(seen > 0, seen / penalty, seen * penalty))  # repeats write equal values
    sub.scatter_add_(1, _padded(output_ids, device), -_padded(output_adjust, device, fill=0.0))
    logits[index] = sub
    return logits


def _padded(lists: list[list], device: torch.device, fill=None) -> torch.Tensor:
    """Rows of unequal length as one tensor, padded with ``fill`` (default: the row's first item)."""
    width = max(len(values) for values in lists)
    rows = [values + [values[0] if fill is None else fill] * (width - len(values)) for values in lists]
    return torch.tensor(rows, device=device)


def bad_word_token_ids(words: list[str], tokenizer) -> list[list[int]]:
    """Each bad word as tokens, alone and after a space (as it appears mid-sentence)."""
    sequences = []
    for word in words:
        for variant in (word, " " + word.lstrip()):
            ids = tokenizer.encode(variant, add_special_tokens=False)
            if ids and ids not in sequences:
                sequences.append(ids)
    return sequences
