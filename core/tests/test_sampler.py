"""Sampler semantics on hand-built logits (no model needed)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import RepetitionPenaltyLogitsProcessor

from kvserve.request import Request
from kvserve.sampling import Sampler, row_argmax, row_topk
from kvserve.sampling_params import SamplingParams

VOCAB = 12


def request(rid="r", prompt=(1, 2, 3), output=(), **params):
    r = Request(rid, list(prompt), SamplingParams(**params), eos_token_ids=(0,))
    r.output_token_ids = list(output)
    return r


def processed(logits, requests):
    return Sampler(0).process(logits, requests)[0]


def test_repetition_penalty_matches_hf_over_prompt_and_output():
    logits = torch.randn(1, VOCAB)
    r = request(prompt=(1, 2, 3), output=(3, 5, 5), repetition_penalty=1.7)
    expected = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([[1, 2, 3, 3, 5, 5]]), logits.clone())
    torch.testing.assert_close(processed(logits, [r]), expected)


def test_presence_and_frequency_penalties_follow_openai_over_output_only():
    logits = torch.zeros(1, VOCAB)
    r = request(prompt=(7,), output=(3, 5, 5), presence_penalty=0.5, frequency_penalty=0.25)
    out = processed(logits, [r])[0]
    assert out[3] == pytest.approx(-(0.25 * 1 + 0.5))
    assert out[5] == pytest.approx(-(0.25 * 2 + 0.5))
    assert out[7] == 0 and out[1] == 0  # prompt tokens are not penalised by presence/frequency


def test_penalties_apply_per_row_only_where_requested():
    logits = torch.ones(2, VOCAB)
    plain = request("a", output=(4,))
    penalised = request("b", output=(4,), frequency_penalty=1.0)
    out = processed(logits, [plain, penalised])
    assert out[0, 4] == 1.0 and out[1, 4] == 0.0


def test_bias_allowed_tokens_and_min_tokens_mask():
    logits = torch.zeros(3, VOCAB)
    rows = [
        request("a", logit_bias={6: 5.0}),
        request("b", allowed_token_ids=[2, 9]),
        request("c", min_tokens=2, stop_token_ids=[8], output=(4,)),
    ]
    out = processed(logits, rows)
    assert out[0].argmax() == 6
    assert torch.isinf(out[1]).sum() == VOCAB - 2 and out[1, 2] == 0 and out[1, 9] == 0
    assert torch.isinf(out[2, 0]) and torch.isinf(out[2, 8])  # EOS and stop token banned before min_tokens


def test_a_row_with_every_token_ruled_out_fails_alone():
    """allowed_token_ids holding only EOS, banned before min_tokens: that row fails (with logprobs asked,
    nothing breaks); its neighbour samples as usual."""
    doomed = request("a", allowed_token_ids=[0], min_tokens=3, logprobs=2, temperature=1.0)
    fine = request("b", logprobs=2, temperature=0.0)
    logits = torch.randn(2, VOCAB)
    out = Sampler(0)(logits, [doomed, fine])
    assert set(out.errors) == {0} and "every token is ruled out" in out.errors[0]
    assert out.tokens[1] == int(logits[1].argmax()) and len(out.logprobs) == 2


def test_logits_processor_sees_history_and_runs_first():
    seen = []

    def force_seven(output_ids, row):
        seen.append(list(output_ids))
        row = torch.full_like(row, -10.0)
        row[7] = 10.0
        return row

    r = request(output=(1, 2), logits_processors=[force_seven], temperature=0.0)
    assert Sampler(0)(torch.randn(1, VOCAB), [r]).tokens == [7]
    assert seen == [[1, 2]]


def test_top_k_top_p_min_p_restrict_support():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1] + [1e-9] * (VOCAB - 4)]))
    cases = {"top_k": ({"top_k": 2}, {0, 1}), "top_p": ({"top_p": 0.7}, {0, 1}), "min_p": ({"min_p": 0.35}, {0, 1})}
    for name, (params, support) in cases.items():
        sampler = Sampler(0)
        rows = [request(f"{name}{i}", **params) for i in range(200)]
        drawn = set(sampler(logits.repeat(200, 1), rows).tokens)
        assert drawn == support, name


def test_seeded_rows_are_independent_of_batch_composition():
    logits = torch.randn(1, VOCAB)
    alone = Sampler(1)(logits, [request("s", seed=42)]).tokens
    others = [request(f"o{i}") for i in range(5)]
    batch = Sampler(2)(logits.repeat(6, 1), others[:3] + [request("s", seed=42)] + others[3:]).tokens
    assert batch[3] == alone[0]


def test_logprobs_report_raw_distribution_top_n_and_chosen_rank():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0] + [-5.0] * (VOCAB - 4)])
    r = request(logprobs=2, temperature=0.0, logit_bias={3: 50.0})  # processing picks token 3
    out = Sampler(0)(logits, [r])
    raw = logits.log_softmax(-1)[0]
    assert out.tokens == [3]
    entry = out.logprobs[0]
    assert set(entry) == {0, 1, 3}
    assert entry[3].rank == 4 and entry[3].logprob == pytest.approx(float(raw[3]))
    assert entry[0].rank == 1 and entry[0].logprob == pytest.approx(float(raw[0]))


@pytest.mark.parametrize(
    "field,value",
    [("temperature", -1), ("top_p", 0), ("top_k", -2), ("n", 0), ("logprobs", 21), ("max_tokens", 0), ("min_p", 2)],
)
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_invalid_combinations_are_refused():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=2)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=["x"], detokenize=False)
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[])
    assert SamplingParams(stop="END").stop == ["END"]


def test_top_k_holds_in_a_mixed_batch_beside_a_row_without_top_k():
    # Issue 9: with another row at top_k=0 and no top_p, the top_k row used to sample the whole vocabulary.
    logits = torch.zeros(1, VOCAB)
    logits[0, :3] = torch.tensor([3.0, 2.9, 2.8])
    rows = [request(f"k{i}", top_k=2) if i % 2 == 0 else request(f"all{i}") for i in range(400)]
    tokens = Sampler(0)(logits.repeat(len(rows), 1), rows).tokens
    assert set(tokens[0::2]) == {0, 1}
    assert len(set(tokens[1::2])) > 2  # the unfiltered rows still range over the vocabulary


def test_seeded_tokens_do_not_depend_on_neighbours_width_sorting_or_batch_size():
    torch.manual_seed(3)
    vocab = 50
    logits = torch.randn(1, vocab)

    def run(neighbours, steps=8):
        sampler = Sampler(7)
        position = len(neighbours) // 2
        rows = neighbours[:position] + [request("s", seed=1234, top_k=20)] + neighbours[position:]
        return [sampler(logits.repeat(len(rows), 1), rows).tokens[position] for _ in range(steps)]

    alone = run([])
    assert run([request("p", top_p=0.5), request("k", top_k=7)]) == alone
    assert run([request(f"o{i}", top_k=i % 9, top_p=1.0 if i % 3 else 0.8) for i in range(63)]) == alone
    assert run([request("big", top_k=45)]) == alone  # a wider top-k in the batch: same noise


def test_top_k_beyond_the_vocabulary_is_clamped():
    logits = torch.randn(4, VOCAB)
    rows = [request(f"r{i}", top_k=2**63 + i, seed=i) for i in range(4)]
    assert len(Sampler(0)(logits, rows).tokens) == 4


def test_a_failing_logits_processor_fails_only_its_row():
    def broken(output_ids, row):
        raise RuntimeError("boom")

    logits = torch.randn(2, VOCAB)
    rows = [request("bad", logits_processors=[broken]), request("good", temperature=0.0)]
    out = Sampler(0)(logits, rows)
    assert list(out.errors) == [0] and "RuntimeError: boom" in out.errors[0]
    assert out.tokens[1] == int(logits[1].argmax())


@pytest.mark.parametrize(
    "fields,name",
    [
        ({"seed": 2**64}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"seed": 2**63 - 2, "n": 3}, "seed"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
        ({"presence_penalty": float("nan")}, "presence_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"logit_bias": {1: float("nan")}}, "logit_bias"),
    ],
)
def test_out_of_range_numbers_are_refused_naming_the_field(fields, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**fields)


def test_tiny_temperatures_are_greedy():
    assert SamplingParams(temperature=1e-6).greedy and not SamplingParams(temperature=1e-4).greedy
    assert SamplingParams(seed=2**63 - 3, n=3).seed == 2**63 - 3


def test_every_filter_holds_for_its_rows_in_one_mixed_batch():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1] + [1e-9] * (VOCAB - 4)]))
    kinds = [({"top_k": 2}, {0, 1}), ({"top_p": 0.7}, {0, 1}), ({"min_p": 0.35}, {0, 1}),
             ({"top_k": 3, "top_p": 0.7}, {0, 1}), ({"top_k": 3}, {0, 1, 2}), ({}, None)]  # fmt: skip
    # Every other round of kinds seeded, each row with its own seed.
    rows = [request(f"r{i}", seed=i if (i // len(kinds)) % 2 else None, **kinds[i % len(kinds)][0]) for i in range(600)]
    tokens = Sampler(0)(logits.repeat(len(rows), 1), rows).tokens
    for k, (params, support) in enumerate(kinds):
        drawn = set(tokens[k :: len(kinds)])
        assert drawn == support if support is not None else {0, 1, 2, 3} <= drawn, params


@pytest.mark.parametrize(
    "params",
    [
        {"logit_bias": {4: 100.0}},
        {"min_tokens": 3, "stop_token_ids": [9]},
        {"allowed_token_ids": [2, 4]},
        {"repetition_penalty": 1.5},
        {},
    ],
    ids=["bias", "min-tokens-ban", "allowed", "penalty", "plain-greedy"],
)
def test_the_callers_logits_are_left_as_given(params):
    logits = torch.randn(2, VOCAB)
    before = logits.clone()
    Sampler(0)(logits, [request("a", output=(1,), **params), request("b")])
    assert torch.equal(logits, before)


@pytest.mark.parametrize("logprobs", [None, 2])
def test_owned_logits_sample_as_a_copy_does_and_raw_logprobs_still_see_the_raw_values(logprobs):
    logits = torch.randn(3, VOCAB)
    rows = lambda: [  # noqa: E731
        request("a", output=(1,), logit_bias={4: 3.0}, temperature=0.8, seed=1, logprobs=logprobs),
        request("b", repetition_penalty=1.5, seed=2, temperature=1.0),
        request("c", allowed_token_ids=[2, 4, 6]),
    ]
    copied = Sampler(0)(logits, rows())
    owned = Sampler(0)(logits.clone(), rows(), logits_owned=True)
    assert owned.tokens == copied.tokens
    assert owned.logprobs == copied.logprobs


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 5),
    vocab=st.sampled_from([1, 7, 1000, 8191, 8192, 8200, 8319, 12345]),
    levels=st.integers(1, 4),
    specials=st.lists(st.sampled_from([float("inf"), float("-inf"), float("nan")]), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_row_argmax_is_torch_argmax(rows, vocab, levels, specials, seed):
    """Ties (values drawn from a few levels), infinities and NaN anywhere, any vocabulary size: the
    same column as ``torch.argmax``, the first maximum."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (rows, vocab), generator=generator).float()
    for value in specials:
        x[torch.randint(0, rows, (1,), generator=generator), torch.randint(0, vocab, (1,), generator=generator)] = value
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 5),
    vocab=st.sampled_from([1, 50, 1000, 6400, 6401, 8192, 8230, 12345]),
    k=st.sampled_from([1, 5, 20, 50]),
    levels=st.sampled_from([3, 1000, 10**6]),
    specials=st.lists(st.sampled_from([float("inf"), float("-inf")]), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_row_topk_finds_torch_topks_values(rows, vocab, k, levels, specials, seed):
    """Any vocabulary (whole chunks or a tail), ties, infinities: the same values as ``torch.topk``,
    best first, each at a distinct column that holds it."""
    k = min(k, vocab)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, levels, (rows, vocab), generator=generator).float()
    for value in specials:
        x[torch.randint(0, rows, (1,), generator=generator), torch.randint(0, vocab, (1,), generator=generator)] = value
    values, columns = row_topk(x, k)
    assert torch.equal(values, x.topk(k, dim=-1).values)
    assert torch.equal(x.gather(1, columns), values)
    assert all(len(set(row)) == k for row in columns.tolist())


def reference_distribution(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """vLLM's order, written plainly: temperature, min-p, top-k, top-p (ties at the edge kept), renormalized."""
    probs = (logits / temperature).softmax(-1).double()
    probs[probs < probs.max() * min_p] = 0
    if top_k:
        probs[probs < probs.topk(top_k).values[-1]] = 0
    values = probs.sort(descending=True).values
    kept = values[(values.cumsum(0) - values) < top_p * probs.sum()]
    probs[probs < kept.min()] = 0
    return probs / probs.sum()


@pytest.mark.parametrize(
    "scale,params",
    [
        (2.0, {"temperature": 1.0}),
        (2.0, {"temperature": 0.5}),
        (2.0, {"temperature": 1.0, "top_p": 0.6}),
        (2.0, {"temperature": 0.8, "top_p": 0.9, "min_p": 0.05}),
        (2.0, {"temperature": 1.0, "top_k": 5, "top_p": 0.8}),
        (2.0, {"temperature": 1.0, "min_p": 0.2}),
        (0.01, {"temperature": 1.0, "top_p": 0.1}),  # flat: most draws fall outside, rows end up sorting
        (0.01, {"temperature": 0.7, "top_p": 0.9, "seed": 5}),
    ],
)
def test_draws_follow_the_truncated_distribution_exactly(scale, params):
    """20,000 draws per case: the observed frequencies are within sampling noise of the reference
    distribution (total variation below 0.03 over 40 tokens) and never leave its support."""
    vocab, rows, rounds = 40, 2000, 10
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(1)) * scale
    expected = reference_distribution(logits[0], **{k: v for k, v in params.items() if k != "seed"})
    sampler = Sampler(11)
    requests = [request(f"r{i}", **{**params, **({"seed": i} if "seed" in params else {})}) for i in range(rows)]
    counts = torch.zeros(vocab, dtype=torch.float64)
    for _ in range(rounds):
        tokens = sampler(logits.repeat(rows, 1), requests).tokens
        counts += torch.bincount(torch.tensor(tokens), minlength=vocab).double()
        for r, token in zip(requests, tokens):  # the next round samples the next position, as decoding does
            r.output_token_ids.append(token)
    observed = counts / counts.sum()
    assert set(observed.nonzero().flatten().tolist()) <= set(expected.nonzero().flatten().tolist())
    assert 0.5 * (observed - expected).abs().sum() < 0.03


def test_a_draw_never_lands_on_a_token_without_probability():
    """Rows whose tail is masked to -inf: even the extreme uniform draws stay on allowed tokens."""
    logits = torch.full((64, 1000), float("-inf"))
    logits[:, 10:13] = torch.tensor([0.0, 1.0, 2.0])
    rows = [request(f"r{i}", temperature=1.0, seed=i) for i in range(64)]
    for _ in range(20):
        assert set(Sampler(0)(logits, rows).tokens) <= {10, 11, 12}


@settings(max_examples=50, deadline=None)
@given(rows=st.integers(1, 4), vocab=st.integers(1, 200), seed=st.integers(0, 2**16))
def test_the_host_and_device_unpacking_of_a_bitmask_agree(rows, vocab, seed):
    """The CPU path (numpy) and the accelerator path (torch bit ops, run here on the CPU) read bit ``j`` of
    word ``w`` as token ``32 * w + j``, sign bit included."""
    from kvserve.interfaces.logits_constraint import bitmask_words
    from kvserve.sampling.constraint_mask import banned_tokens, unpack_on_device

    generator = torch.Generator().manual_seed(seed)
    words = bitmask_words(vocab)
    bitmask = torch.randint(-(2**31), 2**31, (rows, words), dtype=torch.int64, generator=generator).to(torch.int32)
    host = banned_tokens(bitmask, vocab, torch.device("cpu"))
    expected = torch.tensor(
        [[not (int(bitmask[r, t // 32]) >> (t % 32)) & 1 for t in range(vocab)] for r in range(rows)]
    ).view(rows, vocab)
    assert torch.equal(host, expected) and torch.equal(unpack_on_device(bitmask, vocab), expected)


def test_a_batch_constraint_mask_allowing_one_token_per_row_forces_it():
    """The first pipeline stage: each row's constraint allows one token (a different one per row, at
    word boundaries too); greedy and sampled rows alike emit it, and accepted tokens reach the constraint."""
    from kvserve.interfaces import LogitsConstraint

    class OneToken(LogitsConstraint):
        def __init__(self, token):
            self.token, self.accepted = token, []

        def fill_bitmask(self, bitmask, row):
            bitmask[row] = 0
            bitmask[row, self.token // 32] = 1 << (self.token % 32) if self.token % 32 < 31 else -(2**31)

        def accept_tokens(self, token_ids):
            self.accepted += token_ids
            return token_ids == [self.token]

        def is_terminated(self):
            return False

    vocab = 100
    forced = [0, 31, 32, 63, 64, 99, 7, 50]
    rows = []
    for i, token in enumerate(forced):
        r = request(f"r{i}", temperature=0.0 if i % 2 else 1.0, seed=i if i % 4 == 0 else None)
        r.logits_constraint = OneToken(token)
        rows.append(r)
    rows.append(request("free", temperature=0.0))
    logits = torch.randn(len(rows), vocab)
    sampler = Sampler(0)
    out = sampler(logits, rows)
    assert out.tokens[: len(forced)] == forced and not out.errors
    assert out.tokens[-1] == int(logits[-1].argmax())  # an unconstrained row is left alone
    for r, token in zip(rows, out.tokens):
        sampler.accept(r, [token])
    assert [r.logits_constraint.accepted for r in rows[: len(forced)]] == [[t] for t in forced]
    with pytest.raises(ValueError, match="refused"):
        sampler.accept(rows[0], [5])


def test_a_failing_constraint_fails_only_its_row():
    from kvserve.interfaces import LogitsConstraint

    class Broken(LogitsConstraint):
        def fill_bitmask(self, bitmask, row):
            raise RuntimeError("grammar state lost")

        def accept_tokens(self, token_ids):
            return True

        def is_terminated(self):
            return False

    rows = [request("bad"), request("good", temperature=0.0)]
    rows[0].logits_constraint = Broken()
    logits = torch.randn(2, VOCAB)
    out = Sampler(0)(logits, rows)
    assert list(out.errors) == [0] and "grammar state lost" in out.errors[0]
    assert out.tokens[1] == int(logits[1].argmax())


@pytest.mark.parametrize("mode", ["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"])
def test_logprobs_modes_report_the_raw_or_the_processed_distribution(mode):
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0] + [-5.0] * (VOCAB - 4)])
    r = request(logprobs=3, temperature=0.5, top_k=2, seed=3)
    entry = Sampler(0, logprobs_mode=mode)(logits, [r]).logprobs[0]
    scaled = logits[0] / 0.5
    expected = {
        "raw_logprobs": logits[0].log_softmax(-1),
        "raw_logits": logits[0],
        "processed_logprobs": torch.cat([scaled[:2].log_softmax(-1), torch.full((VOCAB - 2,), float("-inf"))]),
        "processed_logits": torch.cat([scaled[:2], torch.full((VOCAB - 2,), float("-inf"))]),
    }[mode]
    for token, logprob in entry.items():
        assert logprob.logprob == pytest.approx(float(expected[token]))
    assert set(entry) >= {0, 1}
