"""The engine's side of speculative decoding: asking the proposer for drafts, counting what is accepted."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvserve.config import EngineConfig, SpeculativeConfig
from kvserve.errors import ConfigError
from kvserve.interfaces.proposer import DraftProposer, DraftRequest, TargetModel
from kvserve.plugins import load_component
from kvserve.request import Request, RequestStatus
from kvserve.spec_decode.draft_budget import DraftBudget
from kvserve.spec_decode.verification import can_verify_constraint

if TYPE_CHECKING:
    import torch


@dataclass
class SpecDecodeStats:
    """Counters since start, as vLLM's ``spec_decode_*`` metrics count them."""

    num_drafts: int = 0
    """Verification chunks that carried at least one draft."""
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    """Drafts accepted at each draft position (0: the first draft of a chunk)."""

    def copy(self) -> SpecDecodeStats:
        """A snapshot that later steps do not change."""
        return SpecDecodeStats(
            self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, list(self.accepted_per_position)
        )

    def record(self, num_drafts: int, num_accepted: int) -> None:
        """One chunk verified ``num_drafts`` drafts (at least one) and kept the first ``num_accepted``."""
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_drafts:
            self.accepted_per_position.extend([0] * (num_drafts - len(self.accepted_per_position)))
        for position in range(num_accepted):
            self.accepted_per_position[position] += 1


def load_proposer(config: EngineConfig, vocab_size: int, target: TargetModel) -> DraftProposer:
    """The proposer ``speculative_config.method`` names, built and attached to ``target``; ConfigError
    for a combination that cannot run (the registry's error, naming what is installed, for an
    unknown method)."""
    spec = config.decoding.speculative_config
    if config.model.logits_processors:
        raise ConfigError(
            "speculative_config cannot be combined with logits_processors (batch-level processors track "
            "one row per request; verification samples several per request) in this version"
        )
    cls = load_component("proposer", spec.method)
    proposer = cls(spec, vocab_size)
    proposer.attach(target)
    return proposer


class Speculator:
    """Gives decoding requests their drafts between steps, within ``num_speculative_tokens`` and
    ``disable_by_batch_size``, trimmed by the draft budget (``adaptive_draft_length``); counts what
    verification kept."""

    def __init__(self, config: SpeculativeConfig, proposer: DraftProposer) -> None:
        self.config = config
        self.proposer = proposer
        self.stats = SpecDecodeStats()
        self.budget = DraftBudget() if config.adaptive_draft_length else None

    def record_step(self, num_tokens: int, seconds: float) -> None:
        """A step computed ``num_tokens`` tokens in ``seconds`` (what the draft budget costs steps by)."""
        if self.budget is not None:
            self.budget.record_step(num_tokens, seconds)

    def record_verification(self, request_id: str, num_drafts: int, num_accepted: int) -> None:
        """``request_id``'s chunk verified ``num_drafts`` drafts (at least one) and kept the first ``num_accepted``."""
        self.stats.record(num_drafts, num_accepted)
        if self.budget is not None:
            self.budget.record_verification(request_id, num_drafts, num_accepted)

    @property
    def uses_hidden_states(self) -> bool:
        """Whether steps keep the target's hidden states for the proposer."""
        return self.proposer.uses_hidden_states

    def propose(
        self, requests: Sequence[Request], num_running: int, hidden_states: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """Set ``draft_token_ids`` of each of ``requests`` (this step's sampled ones) that decodes next:
        none when more than ``disable_by_batch_size`` requests run, or for a request whose grammar
        cannot roll back. ``hidden_states``: request id -> the rows of its emitted tokens, when
        :attr:`uses_hidden_states`."""
        limit = self.config.disable_by_batch_size
        if limit is not None and num_running > limit:
            for request in requests:
                request.draft_token_ids = []
            return
        wanted = [
            r
            for r in requests
            if r.status is RequestStatus.RUNNING
            and r.num_computed_tokens == r.num_tokens - 1
            and can_verify_constraint(r.logits_constraint)
        ]
        if not wanted:
            return
        hidden = hidden_states or {}
        views = [
            DraftRequest(r.request_id, r.prompt_token_ids, r.output_token_ids, hidden.get(r.request_id)) for r in wanted
        ]
        proposals = self.proposer.propose(views, [self.config.num_speculative_tokens] * len(wanted))
        drafts = [self._well_formed(proposed) for proposed in proposals]
        if len(drafts) != len(wanted):
            raise ValueError(f"proposer {self.config.method!r} answered {len(drafts)} requests of {len(wanted)}")
        if self.budget is not None:
            lengths = self.budget.lengths([r.request_id for r in wanted], [len(d) for d in drafts], num_running)
            drafts = [d[:n] for d, n in zip(drafts, lengths)]
        for request, kept in zip(wanted, drafts):
            request.draft_token_ids = kept

    def _well_formed(self, proposed: Sequence[int]) -> list[int]:
        """The proposal up to its first id that is not a token of the vocabulary, at most
        ``num_speculative_tokens`` long: a faulty proposer slows a request down, never breaks a step."""
        drafts = []
        for token in proposed[: self.config.num_speculative_tokens]:
            if not isinstance(token, int) or not 0 <= token < self.proposer.vocab_size:
                break
            drafts.append(token)
        return drafts

    def forget(self, request_id: str) -> None:
        """``request_id`` finished: the proposer and the draft budget drop what they keep for it."""
        self.proposer.forget(request_id)
        if self.budget is not None:
            self.budget.forget(request_id)
