"""Picking the token: greedy argmax, or temperature, min-p, top-k, top-p and one draw per row.

Every draw inverts the row's cumulative distribution at one uniform number, in token-id order (or
best-first among a top-k's candidates): a softmax, a cumsum and a search, no per-element random
numbers (``exponential_`` and ``multinomial`` cost 30-60x a softmax on a CPU) and no sort of the
vocabulary. Rows without a top-k are drawn by the platform's :class:`SamplingKernel` (one fused pass
over each row on the CPU; core's PyTorch ops elsewhere). Top-p without top-k is exact by rejection:
a token drawn from the min-p-truncated distribution is kept when the mass of the tokens strictly
more likely than it is below ``top_p`` — exactly the nucleus — and drawn again otherwise; every
nucleus holds at least ``top_p`` of the mass, so most rows settle in one round, and the few left
after ``NUCLEUS_ROUNDS`` sort. Ties at the nucleus' edge are all kept.
"""

from __future__ import annotations

import math

import torch

from kvserve.interfaces.sampling_kernel import SamplingKernel
from kvserve.request import Request
from kvserve.sampling.noise import NoiseSource
from kvserve.sampling.torch_kernel import min_p_probs, search_cdf

ARGMAX_CHUNK = 128
ARGMAX_MIN_VOCAB = 8192
TOPK_CHUNK = 64
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


def row_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, dim=-1)`` of a 2-D ``x`` (values best first, their columns), found among the ``k``
    chunks with the highest maxima: ATen's CPU topk walks the whole row (2.6 ms for 32 rows of a 49k
    vocabulary and k = 50 on one core; this, 1.4 ms; k = 5: 2.0 vs 0.46 ms).

    Exact: a chunk whose maximum is below the ``k``-th highest chunk maximum holds nothing above the
    ``k`` values those chunks' maxima are. The columns after the last whole chunk are always looked
    at. Among tied values the columns returned may differ from ``x.topk``'s (neither promises one).
    """
    vocab = x.shape[1]
    if 2 * k * TOPK_CHUNK > vocab:
        return x.topk(k, dim=-1)
    whole = vocab // TOPK_CHUNK * TOPK_CHUNK
    _, chunks = x[:, :whole].unflatten(1, (-1, TOPK_CHUNK)).amax(dim=-1).topk(k, dim=-1)
    columns = (chunks.unsqueeze(-1) * TOPK_CHUNK + torch.arange(TOPK_CHUNK, device=x.device)).flatten(1)
    if whole < vocab:
        tail = torch.arange(whole, vocab, device=x.device).expand(x.shape[0], -1)
        columns = torch.cat([columns, tail], dim=1)
    values, picked = x.gather(1, columns).topk(k, dim=-1)
    return values, columns.gather(1, picked)


def draw(logits: torch.Tensor, requests: list[Request], noise: NoiseSource, kernel: SamplingKernel) -> torch.Tensor:
    """One token per row of float32 ``logits`` ``[rows, vocab]`` (already processed), by each row's
    temperature, min-p, top-k and top-p; ``requests[i]`` owns row ``i``. Rows without a top-k are drawn
    by ``kernel``. Returns int64 ``[rows]``."""
    device, vocab = logits.device, logits.shape[1]
    top_k = [min(r.sampling_params.top_k, vocab) if r.sampling_params.top_k > 0 else vocab for r in requests]
    narrow = [i for i, k in enumerate(top_k) if k < vocab]
    if not narrow:
        return _draw_full(logits, requests, noise, kernel)
    if len(narrow) == len(requests):
        return _draw_top_k(logits, requests, top_k, noise)
    tokens = torch.empty(len(requests), dtype=torch.long, device=device)
    wide = [i for i, k in enumerate(top_k) if k == vocab]
    index = torch.tensor(narrow, device=device)
    tokens[index] = _draw_top_k(logits[index], [requests[i] for i in narrow], [top_k[i] for i in narrow], noise)
    index = torch.tensor(wide, device=device)
    tokens[index] = _draw_full(logits[index], [requests[i] for i in wide], noise, kernel)
    return tokens


def _draw_top_k(logits: torch.Tensor, requests: list[Request], top_k: list[int], noise: NoiseSource) -> torch.Tensor:
    """Rows with a top-k: only the batch's widest ``k`` best candidates, best first, are looked at, so
    a row's draw does not depend on how wide its neighbours' top-k is."""
    device = logits.device
    values, ids = row_topk(logits, max(top_k))
    values = values / _per_row(requests, "temperature", device).unsqueeze(1)
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


def _draw_full(
    logits: torch.Tensor, requests: list[Request], noise: NoiseSource, kernel: SamplingKernel
) -> torch.Tensor:
    """Rows without a top-k, over the whole vocabulary in token-id order: the kernel's draw, drawn
    again for the rows it says fell outside their nucleus, and sorted after ``NUCLEUS_ROUNDS``."""
    device = logits.device
    temperature, min_p, top_p = (_per_row(requests, name, device) for name in ("temperature", "min_p", "top_p"))
    tokens, inside = kernel.draw(logits, temperature, min_p, top_p, noise.uniform(requests, device))
    unsettled = [row for row, ok in enumerate(inside.tolist()) if not ok]
    for _ in range(NUCLEUS_ROUNDS):
        if not unsettled:
            return tokens
        index = torch.tensor(unsettled, device=device)
        uniform = noise.uniform([requests[i] for i in unsettled], device)
        tokens[index], inside = kernel.draw(logits[index], temperature[index], min_p[index], top_p[index], uniform)
        unsettled = [row for row, ok in zip(unsettled, inside.tolist()) if not ok]
    if unsettled:
        index = torch.tensor(unsettled, device=device)
        rows = [requests[i] for i in unsettled]
        probs = min_p_probs(logits[index], temperature[index], min_p[index])
        tokens[index] = _invert(nucleus_probs(probs, rows), noise.uniform(rows, device))
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
    return search_cdf(probs, probs.cumsum(dim=-1), uniform)


def _per_row(requests: list[Request], name: str, device: torch.device) -> torch.Tensor:
    """The sampling parameter ``name`` of every request, as float32 ``[rows]``."""
    return torch.tensor([getattr(r.sampling_params, name) for r in requests], dtype=torch.float32, device=device)


def _log_min_p(requests: list[Request], device: torch.device) -> torch.Tensor | None:
    """``log(min_p)`` per row as ``[rows, 1]`` (``-inf`` where unset); None when no row sets it."""
    min_p = [r.sampling_params.min_p for r in requests]
    if not any(m > 0.0 for m in min_p):
        return None
    return torch.tensor([math.log(m) if m > 0.0 else -math.inf for m in min_p], device=device).unsqueeze(1)
