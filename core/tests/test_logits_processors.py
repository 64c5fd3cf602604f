"""Batch-level logits processors (vLLM v1's interface): the built-in ``no_repeat_ngram`` against HF's
processor and through the contract, and deliberately broken processors that the contract must catch."""

import random
import re

import pytest
import torch
from transformers import NoRepeatNGramLogitsProcessor as HFNoRepeatNGram

from kvserve.interfaces import BatchUpdate, MoveDirectionality
from kvserve.sampling.batch_processors import batch_update
from kvserve.sampling.no_repeat_ngram import NoRepeatNGramLogitsProcessor
from kvserve.sampling_params import SamplingParams
from kvserve.testing import LogitsProcessorContract

NGRAM = "no_repeat_ngram_size"


class TestNoRepeatNGram(LogitsProcessorContract):
    logits_processor = "no_repeat_ngram"

    def example_params(self):
        return [SamplingParams(extra_args={NGRAM: n}) for n in (1, 2, 3)] + [SamplingParams()]

    def invalid_params(self):
        return [(SamplingParams(extra_args={NGRAM: v}), f"extra_args.{NGRAM}") for v in (0, -2, "3", True, 1.5)]


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_no_repeat_ngram_bans_what_hf_bans(size):
    rng = random.Random(size)
    vocab = 32
    histories = [[rng.randrange(5) for _ in range(rng.randint(0, 30))] for _ in range(8)]
    processor = NoRepeatNGramLogitsProcessor(None, torch.device("cpu"), False)
    params = SamplingParams(extra_args={NGRAM: size})
    # The prompt is empty and the history is output: HF's processor sees the whole sequence either way.
    processor.update_state(BatchUpdate(len(histories), [], [(i, params, [], h) for i, h in enumerate(histories)], []))
    logits = torch.randn(len(histories), vocab)
    ours = processor.apply(logits.clone())
    for row, history in enumerate(histories):
        if not history:
            assert torch.equal(ours[row], logits[row])
            continue
        theirs = HFNoRepeatNGram(size)(torch.tensor([history]), logits[row : row + 1].clone())[0]
        assert torch.equal(ours[row], theirs), (size, history)


def test_the_stage_reports_index_by_index_changes():
    a, b, c = (object() for _ in range(3))

    class R:
        def __init__(self):
            self.sampling_params, self.prompt_token_ids, self.output_token_ids = SamplingParams(), [1], []

    a, b, c = R(), R(), R()
    assert batch_update([a, b], [a, b]) is None
    update = batch_update([a, b, c], [a, c])
    assert update.batch_size == 2 and list(update.removed) == [1, 2] and [x[0] for x in update.added] == [1]
    assert update.added[0][3] is c.output_token_ids  # the live list, as vLLM hands it over


class IgnoresMoves(NoRepeatNGramLogitsProcessor):
    """Forgets to follow moved rows: state stays at the old index."""

    def update_state(self, batch_update):
        if batch_update is not None:
            batch_update = BatchUpdate(batch_update.batch_size, batch_update.removed, batch_update.added, [])
        super().update_state(batch_update)


class SwapsOneWay(NoRepeatNGramLogitsProcessor):
    """Treats a swap as a one-way move: the other request's state is lost."""

    def update_state(self, batch_update):
        if batch_update is not None:
            moved = [(a, b, MoveDirectionality.UNIDIRECTIONAL) for a, b, _ in batch_update.moved]
            batch_update = BatchUpdate(batch_update.batch_size, batch_update.removed, batch_update.added, moved)
        super().update_state(batch_update)


class ClaimsArgmaxInvariance(NoRepeatNGramLogitsProcessor):
    def is_argmax_invariant(self):
        return True


class AcceptsAnything(NoRepeatNGramLogitsProcessor):
    @classmethod
    def validate_params(cls, params):
        return None


@pytest.mark.parametrize(
    "mutant,test,message",
    [
        (IgnoresMoves, "test_rows_follow_their_requests_through_batch_changes", "no longer match|did not follow"),
        (SwapsOneWay, "test_rows_follow_their_requests_through_batch_changes", "no longer match|did not follow"),
        (ClaimsArgmaxInvariance, "test_argmax_invariance_is_truthful", "changed the argmax"),
        (AcceptsAnything, "test_invalid_params_are_refused_naming_the_field", "DID NOT RAISE"),
    ],
)
def test_the_contract_catches_broken_processors(mutant, test, message):
    contract = TestNoRepeatNGram()
    kwargs = {"component": mutant}
    failures = []
    for seed in range(8) if "seed" in getattr(contract, test).__code__.co_varnames else [None]:
        if seed is not None:
            kwargs["seed"] = seed
        try:
            getattr(contract, test)(**kwargs)
        except (pytest.fail.Exception, pytest.skip.Exception) as exc:
            failures.append(str(exc))
    assert any(re.search(message, f) for f in failures), failures
