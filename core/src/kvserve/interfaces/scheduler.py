"""The Scheduler interface: what runs in each engine step."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.config import SchedulerConfig
    from kvserve.interfaces.kv_cache import KVCacheManager
    from kvserve.request import Request


@dataclass
class ScheduledRequest:
    """One request's share of a step: tokens ``start .. start + num_tokens - 1`` are computed.

    With lookahead (speculative decoding), the chunk ends with ``num_lookahead`` draft tokens
    (:attr:`draft_token_ids`) at positions ``request.num_tokens ..``, after the request's last
    known token: their KV is written like any other token's, and the step verifies them.
    Lookahead only follows a chunk that reaches the end of the known tokens.
    """

    request: Request
    start: int
    num_tokens: int
    """Tokens computed, the draft tokens included."""
    draft_token_ids: list[int] = field(default_factory=list)
    """The draft tokens verified in this step (taken from ``request.draft_token_ids`` when planned)."""

    @property
    def num_lookahead(self) -> int:
        """Draft tokens at the end of the chunk (0 without speculative decoding)."""
        return len(self.draft_token_ids)

    @property
    def decodes(self) -> bool:
        """True when this chunk starts past the prompt: the request is generating. A recomputed
        (preempted) request starts from 0 again, so its chunks prefill."""
        return self.start >= self.request.num_prompt_tokens

    @property
    def completes_sequence(self) -> bool:
        """True when this chunk reaches the end of the known tokens, so new tokens are sampled.
        (Read before :meth:`Scheduler.update` appends them.)"""
        return self.start + self.num_tokens - self.num_lookahead == self.request.num_tokens

    @property
    def num_sample_positions(self) -> int:
        """Logits rows this chunk needs: ``1 + num_lookahead`` for a chunk that completes its
        sequence, from its last ``1 + num_lookahead`` positions in order (row ``j`` is the
        distribution after the last known token and drafts ``0 .. j-1``: it verifies draft ``j``,
        and the last row gives the bonus token after all drafts); 0 for a partial prefill chunk."""
        return 1 + self.num_lookahead if self.completes_sequence else 0

    def token_ids(self) -> list[int]:
        """The ids of the tokens computed, positions ``start .. start + num_tokens - 1``, drafts last."""
        known_end = self.start + self.num_tokens - self.num_lookahead
        return self.request.token_ids(self.start, known_end) + self.draft_token_ids


@dataclass
class SchedulerOutput:
    """The plan of one step."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """Tokens computed in this step, over all scheduled requests (draft tokens included)."""
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def num_sample_positions(self) -> int:
        """Logits rows this step needs, over all scheduled requests."""
        return sum(s.num_sample_positions for s in self.scheduled)


class AdmissionRule(ABC):
    """A cap on what the running requests may hold together, consulted before each admission.

    For a resource that every token of a step needs and that a step holds only so much of, such
    as distinct LoRA adapters (each a set of weights the step's batch must carry). The engine
    installs rules with :meth:`Scheduler.add_admission_rule`. Each step, before its admissions,
    the scheduler calls :meth:`start_step` with the running requests; then, for each waiting
    request in turn, :meth:`admits` and, if it is admitted, :meth:`admitted`. A request a rule
    refuses keeps its place in the queue and does not hold back the requests behind it. Since
    every request was admitted under the rules, the running set (and so every step, a subset
    of it) stays within them; requests preempted in the step still count until the next.
    """

    @abstractmethod
    def start_step(self, running: Sequence[Request]) -> None:
        """A step's admissions begin; ``running`` are the requests running now (scheduled in this step or not)."""

    @abstractmethod
    def admits(self, request: Request) -> bool:
        """Whether waiting ``request`` may join the running requests now. Pure: asked again in later steps."""

    @abstractmethod
    def admitted(self, request: Request) -> None:
        """``request`` was admitted in this step: count it for the admissions after it."""


class Scheduler(ABC):
    """Decides, step by step, which requests run and how many tokens each computes."""

    name: str

    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager, max_model_len: int) -> None:
        """``kv_cache`` is the engine's manager: the scheduler allocates and frees every request's blocks."""
        self.config = config
        self.kv_cache = kv_cache
        self.max_model_len = max_model_len
        self.admission_rules: list[AdmissionRule] = []

    def add_admission_rule(self, rule: AdmissionRule) -> None:
        """Admit waiting requests only as ``rule`` allows (from the next :meth:`schedule` on)."""
        self.admission_rules.append(rule)

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a new request for admission.

        It is admitted only once ``request.is_ready()`` (e.g. a grammar still compiling holds it
        back) and every admission rule admits it. A request held back this way keeps its place in
        the queue but does not block the requests behind it: they are admitted past it (as vLLM
        does with requests waiting for a grammar). Each step asks it again.
        """

    @abstractmethod
    def abort_request(self, request_id: str) -> Request | None:
        """Drop a waiting or running request and free its blocks; returns it, or None if unknown."""

    @abstractmethod
    def schedule(self) -> SchedulerOutput:
        """Plan one step within ``max_num_batched_tokens`` and ``max_num_seqs``.

        Blocks for every scheduled token are allocated before returning; requests preempted
        to make room have had their blocks freed and are back in the waiting queue. All of a
        step's preemptions come before its first admission: an admitted request may reuse
        cached blocks that running requests fill in this same step (see KVCacheManager).

        Lookahead: a running request whose chunk reaches the end of its known tokens may carry
        ``request.draft_token_ids`` into the step (:attr:`ScheduledRequest.draft_token_ids`): as
        many as fit in the token budget and leave every position below ``max_model_len`` (and no
        more than ``max_tokens`` can use); drafts are dropped, never a budget exceeded or a
        request preempted for them. Planning such a chunk consumes the request's drafts, those
        left out included; a preempted request's drafts are dropped.
        """

    @abstractmethod
    def update(self, output: SchedulerOutput, accepted: list[list[int]]) -> list[Request]:
        """Record a finished step. ``accepted[i]`` are the new tokens of ``output.scheduled[i]``:
        empty for a chunk that does not complete its sequence; for one that does, the accepted
        drafts (a prefix of its ``draft_token_ids``) followed by the token sampled after them
        (the bonus, or the correction of the first rejected draft), so 1 to ``1 + num_lookahead``
        tokens, exactly 1 without lookahead. ValueError if they are not so.

        The tokens are appended one by one, each checked against the stop rules (stop token,
        ``max_tokens``, ``max_model_len``): none is appended past a stop. A completing chunk
        leaves ``request.num_computed_tokens == request.num_tokens - 1`` (the KV of rejected
        drafts, and of accepted ones past a stop, does not count), and after lookahead the
        request's slots past it are given back (:meth:`KVCacheManager.truncate`). Returns the
        requests that finished, whose blocks are already freed."""

    def record_step_time(self, output: SchedulerOutput, seconds: float) -> None:
        """How long the step planned as ``output`` took, end to end (plan, forward, sampling,
        update), in seconds; called after :meth:`update`. A scheduler that sizes steps by time
        learns from it; the default ignores it. Schedulers must also work when it is never called
        (a driver without a clock)."""
        return None

    @abstractmethod
    def has_unfinished(self) -> bool:
        """True while any request is waiting or running."""

    @abstractmethod
    def num_waiting(self) -> int:
        """Requests waiting for admission (new or preempted)."""

    @abstractmethod
    def num_running(self) -> int:
        """Requests admitted and holding blocks."""
