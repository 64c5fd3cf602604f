"""Verification of drafts on given distributions: the tokens emitted with speculation follow the
target distribution exactly (chi-square against the exact probabilities), greedy rows are the argmax,
and each verification row is processed as the request with the drafts before it.

The random draws come from a sampler with a fixed seed, so these tests are deterministic: a threshold
is the chi-square quantile at 1 - 1e-4 for the degrees of freedom, which an exact sampler exceeds once
in 10,000 seeds and a biased one (say, accepting drafts too often) far exceeds at these sample sizes.
"""

from __future__ import annotations

import torch

from kvserve.request import Request
from kvserve.sampling import Sampler
from kvserve.sampling_params import SamplingParams
from kvserve.spec_decode.verification import accepted_tokens, row_requests

VOCAB = 6
CHI2_1E4 = {3: 21.11, 4: 23.51, 5: 25.74}
"""Chi-square quantiles at 1 - 1e-4 by degrees of freedom."""

ROW0 = torch.tensor([1.0, 0.2, 1.4, -0.5, 0.0, 0.8])
ROW1 = torch.tensor([0.3, 1.1, -0.2, 0.9, 0.0, 0.5])


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``probs`` and its degrees of freedom; tokens without
    probability must have no count."""
    support = probs > 0
    assert counts[~support].sum() == 0, f"tokens outside the support were emitted: {counts}"
    expected = probs[support] * counts.sum()
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


def verify(requests: list[Request], drafts: list[int], rows: list[torch.Tensor], seed: int = 1234) -> list[list[int]]:
    """Each request verifies ``drafts`` against logits ``rows`` (one per row) in one sampler call."""
    views = [view for r in requests for view in row_requests(r, drafts, VOCAB)]
    logits = torch.stack(rows * len(requests))
    tokens = Sampler(seed)(logits, views).tokens
    width = len(drafts) + 1
    return [accepted_tokens(drafts, tokens[i * width : (i + 1) * width]) for i in range(len(requests))]


def requests(count: int, **params) -> list[Request]:
    return [Request(f"r{i}", [1, 2], SamplingParams(**params), eos_token_ids=(VOCAB + 1,)) for i in range(count)]


def truncated(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    scaled = logits / temperature
    kept = scaled >= scaled.topk(top_k).values[-1]
    return scaled.masked_fill(~kept, float("-inf")).softmax(-1)


def test_emitted_tokens_follow_the_target_distribution_at_every_position():
    """30,000 requests verify the draft 2 (p = 0.30 at position 0): the first emitted token follows
    row 0's distribution, and the second, where the draft was kept, row 1's."""
    emitted = verify(requests(30_000, temperature=1.0), [2], [ROW0, ROW1])
    first = torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=VOCAB).double()
    statistic, dof = chi_square(first, ROW0.softmax(-1).double())
    assert statistic < CHI2_1E4[dof], f"first tokens: chi-square {statistic:.1f} over {dof} degrees of freedom"
    second = torch.bincount(torch.tensor([e[1] for e in emitted if len(e) == 2]), minlength=VOCAB).double()
    statistic, dof = chi_square(second, ROW1.softmax(-1).double())
    assert statistic < CHI2_1E4[dof], f"second tokens: chi-square {statistic:.1f} over {dof} degrees of freedom"
    kept = sum(len(e) == 2 for e in emitted) / len(emitted)
    assert abs(kept - float(ROW0.softmax(-1)[2])) < 0.02  # accepted with the target's probability of the draft


def test_truncated_and_penalized_rows_keep_their_processed_distribution():
    """Temperature and top-k, and a presence penalty that row 1 applies to the draft before it (as the
    request would once the draft is emitted): the emitted tokens follow the processed distributions."""
    params = {"temperature": 0.7, "top_k": 4, "presence_penalty": 1.5}
    emitted = verify(requests(30_000, **params), [0], [ROW0, ROW1], seed=99)
    first = torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=VOCAB).double()
    statistic, dof = chi_square(first, truncated(ROW0, 0.7, 4).double())
    assert statistic < CHI2_1E4[dof], f"first tokens: chi-square {statistic:.1f} over {dof} degrees of freedom"
    penalized = ROW1.clone()
    penalized[0] -= 1.5  # the kept draft is in the output when row 1 is sampled
    second = torch.bincount(torch.tensor([e[1] for e in emitted if len(e) == 2]), minlength=VOCAB).double()
    statistic, dof = chi_square(second, truncated(penalized, 0.7, 4).double())
    assert statistic < CHI2_1E4[dof], f"second tokens: chi-square {statistic:.1f} over {dof} degrees of freedom"


def test_greedy_keeps_drafts_while_they_are_the_argmax():
    rows = [ROW0, ROW1, ROW0]  # argmaxes 2, 1, 2
    assert verify(requests(1, temperature=0), [2, 1], rows) == [[2, 1, 2]]  # both kept, then the bonus
    assert verify(requests(1, temperature=0), [2, 4], rows) == [[2, 1]]  # the second replaced by the argmax
    assert verify(requests(1, temperature=0), [5, 1], rows) == [[2]]


def test_seeded_requests_emit_the_same_tokens_with_or_without_drafts():
    """A seeded request's token at each position comes from its seed and that position: verifying
    drafts (kept or not) gives the tokens decoding one at a time gives."""
    seeded = requests(200, temperature=1.0, seed=77)
    for i, r in enumerate(seeded):
        r.sampling_params = SamplingParams(temperature=1.0, seed=i)
    one_at_a_time = [Sampler(0)(ROW0[None], [r]).tokens[0] for r in seeded]
    for r, token in zip(seeded, one_at_a_time):
        r.output_token_ids.append(token)
    second = [Sampler(0)(ROW1[None], [r]).tokens[0] for r in seeded]
    for r in seeded:
        r.output_token_ids.clear()
    for draft in range(VOCAB):
        emitted = verify(seeded, [draft], [ROW0, ROW1], seed=5)
        for e, first, after in zip(emitted, one_at_a_time, second):
            assert e == ([first, after] if first == draft else [first])


def test_rows_are_the_request_with_the_drafts_before_them_and_leave_it_as_it_was():
    request = requests(1, temperature=0)[0]
    request.output_token_ids = [3]
    rows = row_requests(request, [4, 5], VOCAB)
    assert rows[0] is request
    assert [r.output_token_ids for r in rows] == [[3], [3, 4], [3, 4, 5]]
    assert all(r.request_id == request.request_id for r in rows)
    assert request.output_token_ids == [3]
