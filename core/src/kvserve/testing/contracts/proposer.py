"""The DraftProposer contract: proposals are well-formed, never longer than asked, deterministic and
independent of the batch; and through the engine, outputs with the proposer are exactly those without
speculation (greedy and seeded sampled, in batches, with chunked prefill and with preemption)."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import pytest

from kvserve.interfaces.proposer import DraftProposer, DraftRequest
from kvserve.testing.contracts._base import ComponentContract, violation

VOCAB = 384
"""The vocabulary of the proposals the contract asks for (that of the tiny test model)."""


def token_histories(rng: random.Random, count: int) -> list[tuple[list[int], list[int]]]:
    """``count`` (prompt, output) pairs: random tokens, repeated phrases (what prompt lookup finds),
    a single token, one token repeated, and outputs of every length from empty on."""
    cases = []
    for i in range(count):
        kind = i % 4
        if kind == 0:
            tokens = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 60))]
        elif kind == 1:
            phrase = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 8))]
            tokens = (phrase * rng.randint(2, 6))[: rng.randint(len(phrase) + 1, 6 * len(phrase))]
        elif kind == 2:
            tokens = [rng.randrange(VOCAB)] * rng.randint(1, 20)
        else:
            tokens = [rng.randrange(VOCAB)]
        cut = rng.randint(1, len(tokens))
        cases.append((tokens[:cut], tokens[cut:]))
    return cases


@cache
def tiny_model_directory(root: str, model_type: str) -> Path:
    """A tiny random model of ``model_type`` with its tokenizer, built once per directory."""
    from kvserve.testing.hf_models import build_tiny_model

    return build_tiny_model(model_type, Path(root) / f"tiny-{model_type}", vocab_size=VOCAB)


def skip_without_target(component: type[DraftProposer]) -> None:
    """Skip a check made without an engine for a proposer that drafts from the target's hidden states:
    it needs a target to draft at all, and its drafts follow the target's rounding, which differs
    between batches. The engine checks below hold it to exact outputs all the same."""
    if component.uses_hidden_states:
        pytest.skip(f"{component.__name__} uses the target's hidden states: checked through the engine only")


class DraftProposerContract(ComponentContract):
    """Every draft proposer plugin must pass this. Subclass it and name the proposer::

    class TestMyProposer(DraftProposerContract):
        proposer = "my_method"
        speculative_fields = {"my_option": 3}  # the method's own config fields, if any
        model_type = "<a transformers model type>"  # optional: else one an installed model plugin serves
    """

    kind = "proposer"
    interface = DraftProposer
    speculative_fields: ClassVar[dict[str, Any]] = {"prompt_lookup_min": 1, "prompt_lookup_max": 3}
    """``speculative_config`` fields besides ``method`` and ``num_speculative_tokens`` the contract uses."""

    num_speculative_tokens: ClassVar[int] = 4

    model_type: ClassVar[str | None] = None
    """A transformers model type (``build_tiny_model``) the engine checks run a tiny random model of; None:
    one an installed model plugin serves."""

    def speculative_config(self) -> dict[str, Any]:
        """The ``speculative_config`` the contract runs the proposer with."""
        return {
            "method": self.component_name(),
            "num_speculative_tokens": self.num_speculative_tokens,
            **self.speculative_fields,
        }

    def build(self, component: type) -> DraftProposer:
        """A fresh proposer, as the engine builds it."""
        from kvserve.config import SpeculativeConfig

        return component(SpeculativeConfig(**self.speculative_config()), VOCAB)

    def test_proposals_are_well_formed_and_never_longer_than_asked(self, component, seed):
        """Each proposal is a list of ints in ``[0, vocab)``, at most as long as asked (0 included)."""
        skip_without_target(component)
        rng = random.Random(seed)
        proposer = self.build(component)
        histories = token_histories(rng, 24)
        requests = [DraftRequest(f"r{i}", p, o) for i, (p, o) in enumerate(histories)]
        asked = [rng.randint(0, 6) for _ in requests]
        proposals = proposer.propose(requests, asked)
        if not isinstance(proposals, list) or len(proposals) != len(requests):
            violation(f"propose returned {proposals!r} for {len(requests)} requests: expected a list per request")
        for request, wanted, drafts in zip(requests, asked, proposals):
            if not isinstance(drafts, list) or len(drafts) > wanted:
                violation(f"{request.request_id}: asked for at most {wanted} drafts, got {drafts!r}")
            bad = [t for t in drafts if type(t) is not int or not 0 <= t < VOCAB]
            if bad:
                violation(f"{request.request_id}: draft ids {bad} are not ints in [0, {VOCAB})")

    def test_proposals_are_deterministic_and_independent_of_the_batch(self, component, seed):
        """The same tokens give the same drafts: asked again, by a fresh proposer, alone or in
        another batch, and after the request grew and was forgotten."""
        skip_without_target(component)
        rng = random.Random(seed)
        histories = token_histories(rng, 16)
        requests = [DraftRequest(f"r{i}", p, o) for i, (p, o) in enumerate(histories)]
        asked = [self.num_speculative_tokens] * len(requests)
        proposer = self.build(component)
        first = proposer.propose(requests, asked)
        if proposer.propose(requests, asked) != first:
            violation("asked twice for the same requests, the proposer gave different drafts")
        if self.build(component).propose(requests, asked) != first:
            violation("a fresh proposer gave other drafts for the same requests")
        alone = self.build(component)
        for i in rng.sample(range(len(requests)), len(requests)):
            if alone.propose([requests[i]], [asked[i]]) != [first[i]]:
                violation(f"{requests[i].request_id}: alone in the batch it got other drafts than in a batch")
        grown = self.build(component)
        for request, drafts in zip(requests, first):
            grown.propose([DraftRequest(request.request_id, request.prompt_token_ids, [])], [2])
            grown.forget(request.request_id)
            if grown.propose([request], [self.num_speculative_tokens]) != [drafts]:
                violation(f"{request.request_id}: after a shorter history and forget, other drafts for the same tokens")

    @pytest.fixture(scope="class")
    def tiny_model(self, tmp_path_factory) -> Path:
        from kvserve.testing.hf_models import served_model_type

        model_type = self.model_type or served_model_type()
        return tiny_model_directory(str(tmp_path_factory.mktemp("proposer-contract")), model_type)

    @pytest.mark.parametrize(
        "engine_fields",
        [{}, {"max_num_batched_tokens": 7}, {"block_size": 4, "num_kv_blocks": 14, "max_model_len": 48}],
        ids=["batched", "chunked-prefill", "preemption"],
    )
    def test_outputs_are_exactly_those_without_speculation(self, component, tiny_model, engine_fields):
        """Through the engine on a tiny model (fp32): greedy and seeded sampled requests in one batch
        emit the same tokens, logprobs rank for rank, with the proposer as without speculation."""
        from kvserve import LLM, SamplingParams

        prompts = [
            [5, 6, 7, 8, 5, 6, 7, 8, 5, 6],
            [40, 41, 40, 41, 40, 41, 40],
            [100 + i for i in range(20)] + [100, 101, 102],
            [3, 9],
            [250] * 12,
        ]
        params = [
            SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2),
            SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=24, ignore_eos=True),
            SamplingParams(temperature=0, max_tokens=19, ignore_eos=True),
            SamplingParams(temperature=1.0, seed=3, max_tokens=24, ignore_eos=True, logprobs=1),
            SamplingParams(temperature=0, max_tokens=24),
        ]
        fields = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 64, **engine_fields}

        def run(**extra: Any) -> list[tuple[list[int], list[list[int]] | None]]:
            llm = LLM(str(tiny_model), **fields, **extra)
            outputs = llm.generate(prompts, params, use_tqdm=False)
            if "num_kv_blocks" in engine_fields:
                assert llm.engine.num_preemptions > 0, "the small KV cache should have forced preemption"
            return [
                (
                    list(o.outputs[0].token_ids),
                    None if o.outputs[0].logprobs is None else [sorted(entry) for entry in o.outputs[0].logprobs],
                )
                for o in outputs
            ]

        plain = run()
        speculative = run(speculative_config=self.speculative_config())
        for i, (without, with_spec) in enumerate(zip(plain, speculative)):
            if without != with_spec:
                violation(
                    f"prompt {i} ({params[i]}): with proposer {self.component_name()!r} the output is "
                    f"{with_spec}, without speculation {without}"
                )


class DraftModelContract(DraftProposerContract):
    """The contract of a proposer that runs a model of its own (``draft_model``): the contract's tiny
    model drafts for itself (``speculative_config["model"]``), built into every proposer the checks
    make through :meth:`~kvserve.interfaces.DraftProposer.attach`, as the engine does."""

    speculative_fields: ClassVar[dict[str, Any]] = {}
    draft_engine_fields: ClassVar[dict[str, Any]] = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 512}
    """The engine the proposers outside an engine are attached to (a KV cache that holds every batch
    the checks propose for, so that no draft depends on what else is in the batch)."""

    @pytest.fixture(autouse=True)
    def _draft_path(self, tiny_model: Path) -> None:
        # The unit checks build proposers outside an engine: they need the model too.
        self.draft_path = str(tiny_model)

    def speculative_config(self) -> dict[str, Any]:
        return {**super().speculative_config(), "model": self.draft_path}

    def build(self, component: type) -> DraftProposer:
        from kvserve import components
        from kvserve.config import EngineConfig
        from kvserve.interfaces.proposer import TargetModel

        proposer = super().build(component)
        config = EngineConfig.from_flat(model=self.draft_path, **self.draft_engine_fields)
        platform = components.resolve_platform(config)
        proposer.attach(TargetModel(config, platform, self.draft_path, config.model.max_model_len))
        return proposer
