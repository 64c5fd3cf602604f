"""The Scheduler interface: what runs in each engine step."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.config import SchedulerConfig
    from kvserve.interfaces.kv_cache import KVCacheManager
    from kvserve.request import Request


@dataclass
class ScheduledRequest:
    """One request's share of a step: tokens ``start .. start + num_tokens - 1`` are computed."""

    request: Request
    start: int
    num_tokens: int

    @property
    def decodes(self) -> bool:
        """True when this chunk starts past the prompt: the request is generating. A recomputed
        (preempted) request starts from 0 again, so its chunks prefill."""
        return self.start >= self.request.num_prompt_tokens

    @property
    def completes_sequence(self) -> bool:
        """True when this chunk reaches the end of the known tokens, so a new token is sampled."""
        return self.start + self.num_tokens == self.request.num_tokens


@dataclass
class SchedulerOutput:
    """The plan of one step."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """Tokens computed in this step, over all scheduled requests."""
        return sum(s.num_tokens for s in self.scheduled)


class Scheduler(ABC):
    """Decides, step by step, which requests run and how many tokens each computes."""

    name: str

    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager, max_model_len: int) -> None:
        """``kv_cache`` is the engine's manager: the scheduler allocates and frees every request's blocks."""
        self.config = config
        self.kv_cache = kv_cache
        self.max_model_len = max_model_len

    @abstractmethod
    def add_request(self, request: Request) -> None:
        """Queue a new request for admission."""

    def add_running(self, request: Request) -> None:
        """Run a request that already holds KV blocks for its ``num_computed_tokens`` tokens.

        For ``n > 1``: a sequence forked from its leader with :meth:`KVCacheManager.fork`
        joins the running set directly, even past ``max_num_seqs`` for a while. Schedulers
        that do not support this keep the default, which raises NotImplementedError.
        """
        raise NotImplementedError(f"scheduler {self.name!r} cannot take forked requests (n > 1)")

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
        """

    @abstractmethod
    def update(self, output: SchedulerOutput, sampled: list[int]) -> list[Request]:
        """Record a finished step. ``sampled[i]`` is the token sampled for ``output.scheduled[i]``
        (ignored unless that chunk completes its sequence). Returns the requests that finished
        (stop token, ``max_tokens`` or ``max_model_len``), whose blocks are already freed."""

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
