"""The LogitsProcessor contract: per-row results that follow each request through adds, removals,
moves and swaps of the batch, honest argmax invariance, and parameter validation that names the field."""

from __future__ import annotations

import random
from typing import Any, ClassVar

import pytest
import torch

from kvserve.config import EngineConfig
from kvserve.interfaces.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
from kvserve.sampling_params import SamplingParams
from kvserve.testing.contracts._base import ComponentContract, violation

SWAP, ONE_WAY = MoveDirectionality.SWAP, MoveDirectionality.UNIDIRECTIONAL


class _Row:
    """A request of the simulated batch: params, a prompt, a live output list and its own base logits."""

    def __init__(self, key: int, params: SamplingParams, vocab: int, rng: random.Random) -> None:
        self.key, self.params = key, params
        self.prompt = [rng.randrange(8) for _ in range(rng.randint(1, 6))]  # few ids: n-grams repeat
        self.output: list[int] = []
        self.logits_seed = rng.randrange(2**31)
        self.vocab = vocab

    def logits(self) -> torch.Tensor:
        """This step's logits for the row: a function of the request and its output length only."""
        gen = torch.Generator().manual_seed(self.logits_seed + len(self.output))
        return torch.randn(self.vocab, generator=gen)


class LogitsProcessorContract(ComponentContract):
    """Every logits processor plugin must pass this. Subclass it and name the processor::

        class TestMyProcessor(LogitsProcessorContract):
            logits_processor = "my_processor"

            def example_params(self):
                return [SamplingParams(extra_args={"my_arg": 3}), SamplingParams()]

    The processor is built as the engine builds it, ``cls(EngineConfig(), torch.device("cpu"), False)``,
    and driven through random sequences of batch changes in vLLM's order (removed, added, moved; a
    removal condensed by one-way moves from the end, swaps), with requests made from
    :meth:`example_params` whose outputs grow every step. A request's processed row must be the
    one it gets alone in a fresh processor with the same history: per-row state follows its request.
    """

    kind = "logits_processor"
    interface = LogitsProcessor
    named = False  # vLLM's interface has no name attribute: the registry name is the only one
    logits_processor: ClassVar[str]
    """Registry name of the processor under test."""
    vocab_size: ClassVar[int] = 64

    # -- hooks -----------------------------------------------------------------------------
    def example_params(self) -> list[SamplingParams]:
        """Params of the simulated requests, which should make the processor act on some rows."""
        return [SamplingParams()]

    def invalid_params(self) -> list[tuple[SamplingParams, str]]:
        """``(params, field)`` pairs ``validate_params`` must refuse with a ValueError naming ``field``."""
        return []

    # -- helpers -----------------------------------------------------------------------------
    @staticmethod
    def build(component: type) -> Any:
        return component(EngineConfig(), torch.device("cpu"), False)

    def _alone(self, component: type, row: _Row) -> torch.Tensor:
        """``row``'s processed logits in a fresh processor where it is the only request."""
        processor = self.build(component)
        processor.update_state(BatchUpdate(1, [], [(0, row.params, row.prompt, row.output)], []))
        return processor.apply(row.logits().unsqueeze(0).clone())[0]

    # -- the contract --------------------------------------------------------------------------
    def test_example_params_are_valid(self, component):
        for params in self.example_params():
            component.validate_params(params)

    def test_invalid_params_are_refused_naming_the_field(self, component):
        for params, field in self.invalid_params():
            with pytest.raises(ValueError, match=field):
                component.validate_params(params)

    def test_rows_follow_their_requests_through_batch_changes(self, component, seed):
        """Random adds, removals (condensed by one-way moves), swaps and quiet steps; each step every
        row must equal its request's row processed alone, and shape, dtype and device are kept."""
        rng = random.Random(seed)
        processor = self.build(component)
        examples = self.example_params()
        batch: list[_Row | None] = []
        keys = iter(range(10**6))
        for step in range(24):
            removed, added, moved = [], [], []
            slots: list[_Row | None] = list(batch)
            if batch and rng.random() < 0.3:  # a request leaves: its index is a hole
                hole = rng.randrange(len(slots))
                removed.append(hole)
                slots[hole] = None
            for _ in range(rng.randint(0, 2) if len(batch) < 6 else 0):  # new requests fill holes first
                row = _Row(next(keys), rng.choice(examples), self.vocab_size, rng)
                index = slots.index(None) if None in slots else len(slots)
                slots[index : index + 1] = [row]
                added.append((index, row.params, row.prompt, row.output))
            while None in slots:  # condense: the last request moves into the first hole
                hole = slots.index(None)
                if hole == len(slots) - 1:
                    slots.pop()
                    continue
                moved.append((len(slots) - 1, hole, ONE_WAY))
                slots[hole] = slots.pop()
            batch = slots
            if len(batch) >= 2 and rng.random() < 0.4:
                a, b = rng.sample(range(len(batch)), 2)
                moved.append((a, b, SWAP))
                batch[a], batch[b] = batch[b], batch[a]
            changed = removed or added or moved
            processor.update_state(BatchUpdate(len(batch), removed, added, moved) if changed else None)
            if not batch:
                continue
            logits = torch.stack([row.logits() for row in batch])
            try:
                out = processor.apply(logits.clone())
            except Exception as exc:
                violation(
                    f"step {step}: apply raised {exc!r} after removed={removed} added at "
                    f"{[a[0] for a in added]} moved={moved}: its rows no longer match the batch"
                )
            if out.shape != logits.shape or out.dtype != logits.dtype or out.device != logits.device:
                violation(f"apply returned {tuple(out.shape)} {out.dtype} on {out.device}, given {tuple(logits.shape)}")
            for index, row in enumerate(batch):
                expected = self._alone(component, row)
                if not torch.equal(out[index], expected):
                    violation(
                        f"step {step}: row {index} (request {row.key}, params {row.params.extra_args}) differs from "
                        "the same request processed alone: per-row state did not follow its request"
                    )
            for row in batch:  # every request emits a token (its row's argmax after processing)
                row.output.append(int(self._alone(component, row).argmax()) % 8)

    def test_argmax_invariance_is_truthful(self, component, seed):
        """A processor claiming argmax invariance never changes any row's argmax."""
        processor = self.build(component)
        if not processor.is_argmax_invariant():
            pytest.skip("the processor does not claim argmax invariance")
        rng = random.Random(seed)
        rows = [_Row(i, rng.choice(self.example_params()), self.vocab_size, rng) for i in range(6)]
        for row in rows:
            row.output.extend(rng.randrange(8) for _ in range(rng.randint(0, 6)))
        processor.update_state(
            BatchUpdate(len(rows), [], [(i, r.params, r.prompt, r.output) for i, r in enumerate(rows)], [])
        )
        logits = torch.stack([row.logits() for row in rows])
        out = processor.apply(logits.clone())
        if not torch.equal(out.argmax(dim=-1), logits.argmax(dim=-1)):
            violation("is_argmax_invariant() is True, but apply changed the argmax of some row")
