"""Picking the token: greedy argmax, or temperature, min-p, top-k, top-p and one draw per row.

Every draw inverts the row's cumulative distribution at one uniform number, in token-id order (or
best-first among a top-k's candidates): a softmax, a cumsum and a binary search, no per-element
random numbers (``exponential_`` and ``multinomial`` cost 30-60x a softmax on a CPU) and no sort of
the vocabulary. Top-p without top-k is exact by rejection: a token drawn from the min-p-truncated
distribution is kept when the mass of the tokens strictly more likely than it is below ``top_p`` —
exactly the nucleus — and drawn again otherwise; every nucleus holds at least ``top_p`` of the
mass, so most rows settle in one round, and the few left after ``NUCLEUS_ROUNDS`` sort.
Ties at the nucleus' edge are all kept.
"""

from __future__ import annotations

import math

import torch

from kvserve.request import Request
from kvserve.sampling.noise import NoiseSource

ARGMAX_CHUNK = 128
ARGMAX_MIN_VOCAB = 8192
NUCLEUS_ROUNDS = 3
"""Rejection rounds before the rows still unsettled sort (each round settles a row with odds >= top_p)."""


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` of a 2-D ``x``, exactly (the first maximum's column; NaN counts as the
    maximum), found through each chunk's maximum: ATen's CPU argmax is a scalar loop (measured 0.33
    ms for 32 rows of a 32k vocabulary on this project's CPU, 4x this), while ``amax`` vectorizes.

    The first chunk whose maximum equals the row's holds the row's first maximum, and within that
    chunk argmax finds its first occurrence; the last, shorter chunk's columns are read clamped to the
    row's end, so a repeated last column can only come after the first maximum.
    """
    vocab = x.shape[1]
    if vocab < ARGMAX_MIN_VOCAB:  # the five ops cost more than one scalar pass over a short row
        return x.argmax(dim=-1)
    whole = vocab // ARGMAX_CHUNK * ARGMAX_CHUNK
    maxima = x[:, :whole].unflatten(1, (-1, ARGMAX_CHUNK)).amax(dim=-1)
    if whole < vocab:
        maxima = torch.cat([maxima, x[:, whole:].amax(dim=-1, keepdim=True)], dim=1)
    chunk = maxima.argmax(dim=-1)
    columns = (chunk[:, None] * ARGMAX_CHUNK + torch.arange(ARGMAX_CHUNK, device=x.device)).clamp_max_(vocab - 1)
    return chunk * ARGMAX_CHUNK + x.gather(1, columns).argmax(dim=-1)


def draw(logits: torch.Tensor, requests: list[Request], noise: NoiseSource) -> torch.Tensor:
    """One token per row of float32 ``logits`` ``[rows, vocab]`` (already processed), by each row's
    temperature, min-p, top-k and top-p; ``requests[i]`` owns row ``i``. Returns int64 ``[rows]``."""
    device, vocab = logits.device, logits.shape[1]
    temperatures = [r.sampling_params.temperature for r in requests]
    if any(t != 1.0 for t in temperatures):
        logits = logits / torch.tensor(temperatures, device=device).unsqueeze(1)
    top_k = [min(r.sampling_params.top_k, vocab) if r.sampling_params.top_k > 0 else vocab for r in requests]
    narrow = [i for i, k in enumerate(top_k) if k < vocab]
    if not narrow:
        return _draw_full(logits, requests, noise)
    if len(narrow) == len(requests):
        return _draw_top_k(logits, requests, top_k, noise)
    tokens = torch.empty(len(requests), dtype=torch.long, device=device)
    wide = [i for i, k in enumerate(top_k) if k == vocab]
    index = torch.tensor(narrow, device=device)
    tokens[index] = _draw_top_k(logits[index], [requests[i] for i in narrow], [top_k[i] for i in narrow], noise)
    index = torch.tensor(wide, device=device)
    tokens[index] = _draw_full(logits[index], [requests[i] for i in wide], noise)
    return tokens


def _draw_top_k(scaled: torch.Tensor, requests: list[Request], top_k: list[int], noise: NoiseSource) -> torch.Tensor:
    """Rows with a top-k: only the batch's widest ``k`` best candidates, best first, are looked at, so
    a row's draw does not depend on how wide its neighbours' top-k is."""
    device = scaled.device
    values, ids = scaled.topk(max(top_k), dim=-1)
    drop = torch.arange(values.shape[1], device=device) >= torch.tensor(top_k, device=device).unsqueeze(1)
    min_p = _log_min_p(requests, device)
    if min_p is not None:
        drop |= values < values[:, :1] + min_p
    probs = values.masked_fill(drop, float("-inf")).softmax(dim=-1)
    top_p = [r.sampling_params.top_p for r in requests]
    if any(p < 1.0 for p in top_p):
        before = probs.cumsum(dim=-1) - probs  # mass of the better candidates
        probs = probs.masked_fill(before >= torch.tensor(top_p, device=device).unsqueeze(1), 0.0)
    choice = _invert(probs, noise.uniform(requests, device))
    return ids.gather(1, choice.unsqueeze(1)).squeeze(1)


def _draw_full(scaled: torch.Tensor, requests: list[Request], noise: NoiseSource) -> torch.Tensor:
    """Rows without a top-k, over the whole vocabulary in token-id order."""
    device = scaled.device
    probs = scaled.softmax(dim=-1)
    min_p = [r.sampling_params.min_p for r in requests]
    if any(m > 0.0 for m in min_p):
        floor = probs.amax(dim=-1, keepdim=True) * torch.tensor(min_p, device=device).unsqueeze(1)
        probs = probs.masked_fill(probs < floor, 0.0)
    cdf = probs.cumsum(dim=-1)
    tokens = _search(probs, cdf, noise.uniform(requests, device))
    nucleus = [i for i, r in enumerate(requests) if r.sampling_params.top_p < 1.0]
    for _ in range(NUCLEUS_ROUNDS):
        if not nucleus:
            return tokens
        index = torch.tensor(nucleus, device=device)
        rows = probs if len(nucleus) == len(requests) else probs[index]
        chosen = rows.gather(1, tokens[index].unsqueeze(1))
        above = (rows > chosen).mul(rows).sum(dim=-1)
        limit = torch.tensor([requests[i].sampling_params.top_p for i in nucleus], device=device) * cdf[index, -1]
        nucleus = [row for row, inside in zip(nucleus, (above < limit).tolist()) if not inside]
        if nucleus:
            index = torch.tensor(nucleus, device=device)
            tokens[index] = _search(probs[index], cdf[index], noise.uniform([requests[i] for i in nucleus], device))
    if nucleus:
        index = torch.tensor(nucleus, device=device)
        unsettled = [requests[i] for i in nucleus]
        tokens[index] = _invert(nucleus_probs(probs[index], unsettled), noise.uniform(unsettled, device))
    return tokens


def nucleus_probs(probs: torch.Tensor, requests: list[Request]) -> torch.Tensor:
    """``probs`` (rows need not sum to one) with the tokens outside each row's top-p nucleus zeroed: a
    token stays when the mass strictly more likely than it is below ``top_p`` of the row's mass. Sorts
    the rows: the slow, explicit form of what :func:`_draw_full` decides by rejection."""
    top_p = torch.tensor([r.sampling_params.top_p for r in requests], device=probs.device).unsqueeze(1)
    values, _ = probs.sort(dim=-1, descending=True)
    inside = (values.cumsum(dim=-1) - values) < top_p * probs.sum(dim=-1, keepdim=True)
    # The smallest value inside each row's nucleus; every token at least that likely is in it.
    edge = values.masked_fill(~inside, float("inf")).amin(dim=-1, keepdim=True)
    return probs.masked_fill(probs < edge, 0.0)


def _invert(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The column where each row's cumulative ``probs`` (unnormalized) passes ``uniform`` of its total."""
    return _search(probs, probs.cumsum(dim=-1), uniform)


def _search(probs: torch.Tensor, cdf: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The first column whose ``cdf`` exceeds ``uniform * total``: a column with non-zero probability,
    since the cdf only rises on those. A draw that rounds up to the total takes the last such column."""
    target = (uniform * cdf[:, -1]).unsqueeze(1)
    columns = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_max_(cdf.shape[1] - 1)
    empty = probs.gather(1, columns.unsqueeze(1)).squeeze(1) == 0
    if empty.any():
        last = probs.shape[1] - 1 - (probs.flip(1) > 0).int().argmax(dim=-1)
        columns = torch.where(empty, last, columns)
    return columns


def _log_min_p(requests: list[Request], device: torch.device) -> torch.Tensor | None:
    """``log(min_p)`` per row as ``[rows, 1]`` (``-inf`` where unset); None when no row sets it."""
    min_p = [r.sampling_params.min_p for r in requests]
    if not any(m > 0.0 for m in min_p):
        return None
    return torch.tensor([math.log(m) if m > 0.0 else -math.inf for m in min_p], device=device).unsqueeze(1)
