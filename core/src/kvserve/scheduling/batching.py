"""Continuous batching: token budget, max sequences, chunked prefill (with an optional per-request
cap on a step's prefill chunk, and an optional time-aware limit on a step's prefill tokens while
requests decode), recompute preemption, lookahead (draft tokens verified in a step), requests held
back until ready, and admission rules.

A scheduler plugin subclasses :class:`BatchingScheduler` and supplies only the policy:
the order of the waiting queue, which running request to preempt, and whether a waiting
request may preempt running ones to be admitted.
"""

from __future__ import annotations

import bisect
import itertools
from abc import abstractmethod
from typing import TYPE_CHECKING, Any

from kvserve.interfaces.scheduler import ScheduledRequest, Scheduler, SchedulerOutput
from kvserve.request import Request, RequestStatus
from kvserve.scheduling.prefill_time_budget import PrefillTimeBudget

if TYPE_CHECKING:
    from kvserve.config import SchedulerConfig
    from kvserve.interfaces.kv_cache import KVCacheManager


class BatchingScheduler(Scheduler):
    """Each step: running requests first (decodes and unfinished prefill chunks), preempting
    :meth:`preemption_victim` while blocks run out; then, if no one had to be preempted,
    waiting requests in policy order while budget, sequence slots and blocks last. With
    ``max_decode_slowdown`` set, prefill chunks (of running and admitted requests) share a
    further limit while requests decode, unless a burst of prompts that one step takes whole
    outnumbers them (see :class:`PrefillTimeBudget`). The first
    waiting request of a step, short of blocks or of a slot, preempts running victims as long
    as :meth:`may_preempt_for` allows; otherwise admission stops for this step. Waiting requests
    not ready yet, or refused by an admission rule, are passed over (they keep their place).
    A decoding request's drafts ride along while the budget has room and the blocks suffice:
    they are dropped before anyone is preempted for them."""

    @abstractmethod
    def admission_key(self, request: Request) -> Any:
        """Sort key of the waiting queue: smaller is admitted first (ties: arrival order).

        The queue is kept sorted as requests arrive or are preempted, so a request's key must
        not change while it waits.
        """

    @abstractmethod
    def preemption_victim(self, running: list[Request]) -> Request:
        """The running request to preempt when blocks (or, for a waiting request, slots) run out.

        ``running`` is non-empty and in admission order; it may include the request that needs
        the room, which then preempts itself. The victim's blocks are freed and it goes back to
        the waiting queue to be recomputed later.
        """

    def may_preempt_for(self, request: Request, victim: Request) -> bool:
        """Whether waiting ``request``, short of blocks or of a sequence slot, may preempt running
        ``victim`` (this policy's :meth:`preemption_victim`) to be admitted now. Default: never,
        so waiting requests wait for running ones to finish. Asked only for the first request a
        step admits, so at most one request per step gets in by preempting."""
        return False

    def __init__(self, config: SchedulerConfig, kv_cache: KVCacheManager, max_model_len: int) -> None:
        super().__init__(config, kv_cache, max_model_len)
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self._arrival = itertools.count()
        self._arrival_index: dict[str, int] = {}
        slowdown = config.decode_slowdown()
        self.prefill_time_budget = PrefillTimeBudget(slowdown) if slowdown else None

    def _queue_key(self, request: Request) -> tuple[Any, int]:
        return self.admission_key(request), self.arrival_order(request)

    def add_request(self, request: Request) -> None:
        self._arrival_index[request.request_id] = next(self._arrival)
        request.status = RequestStatus.WAITING
        bisect.insort(self.waiting, request, key=self._queue_key)

    def abort_request(self, request_id: str) -> Request | None:
        for queue in (self.waiting, self.running):
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self._finish(request, RequestStatus.FINISHED_ABORTED)
                    return request
        return None

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        scheduled: dict[str, ScheduledRequest] = {}
        budget = self.config.max_num_batched_tokens
        prefill_budget = self._prefill_limit() or budget

        for request in list(self.running):
            decoding = _decoding(request)
            limit = budget if decoding else min(budget, prefill_budget)
            if request.status is not RequestStatus.RUNNING or limit == 0:
                continue  # preempted earlier in this loop, or no budget left
            num_new = self._chunk(request.num_tokens - request.num_computed_tokens, limit)
            drafts = self._take_drafts(request, num_new, limit)
            while not self.kv_cache.allocate_slots(request, num_new + len(drafts)):
                if drafts:
                    drafts = []  # not worth preempting anyone for
                    continue
                victim = self.preemption_victim(self.running)
                budget += self._preempt(victim, output, scheduled)
                if victim is request:
                    break
            else:
                item = ScheduledRequest(request, request.num_computed_tokens, num_new + len(drafts), drafts)
                scheduled[request.request_id] = item
                budget -= item.num_tokens
                prefill_budget -= 0 if decoding else num_new

        if not output.preempted:  # else blocks ran short: let the running requests progress first
            self._admit_waiting(output, scheduled, min(budget, prefill_budget))  # admissions only prefill
        output.scheduled = list(scheduled.values())
        return output

    def _admit_waiting(self, output: SchedulerOutput, scheduled: dict[str, ScheduledRequest], budget: int) -> None:
        """Admit waiting requests in queue order while they fit, passing over those held back."""
        for rule in self.admission_rules:
            rule.start_step(self.running)
        first = True
        passed = 0  # requests at the head of the queue passed over in this step
        while passed < len(self.waiting) and budget > 0:
            request = self.waiting[passed]
            if request in output.preempted:
                return  # first in line, but a victim of this step: it and those behind it wait
            if not request.is_ready() or not all(rule.admits(request) for rule in self.admission_rules):
                passed += 1
                continue
            item = self._fit(request, budget)
            # Preempting only before the step's first admission: that one may reuse blocks a later
            # victim was to compute in this step (see KVCacheManager).
            while item is None and first and (victim := self._victim_for(request)) is not None:
                budget += self._preempt(victim, output, scheduled)
                item = self._fit(request, budget)  # looked up again: the victim's blocks may have been cached ones
            if item is None:
                return
            first = False
            self.waiting.remove(request)  # not pop(0): a victim may have been queued before it
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            request.draft_token_ids = []  # only a running request's drafts are verified
            scheduled[request.request_id] = item
            budget -= item.num_tokens
            for rule in self.admission_rules:
                rule.admitted(request)

    def _fit(self, request: Request, budget: int) -> ScheduledRequest | None:
        """Allocate a waiting request's first chunk within ``budget``, reusing its cached prefix, or None."""
        cached = self.kv_cache.num_cached_tokens(request)
        remaining = request.num_tokens - cached
        num_new = self._chunk(remaining, budget)
        if len(self.running) >= self.config.max_num_seqs or (
            num_new < remaining and not self.config.enable_chunked_prefill
        ):
            return None
        request.num_computed_tokens = cached
        if not self.kv_cache.allocate_slots(request, num_new, cached):
            request.num_computed_tokens = 0
            return None
        return ScheduledRequest(request, cached, num_new)

    def _prefill_limit(self) -> int | None:
        """The time-aware limit on this step's prefill tokens, given the requests about to decode and
        the prompt tokens the others have left; None: none."""
        if self.prefill_time_budget is None:
            return None
        decoding = sum(r.status is RequestStatus.RUNNING and _decoding(r) for r in self.running)
        prompts = itertools.chain((r for r in self.running if not _decoding(r)), self.waiting)
        prefills = (r.num_tokens - r.num_computed_tokens for r in prompts)
        return self.prefill_time_budget.prefill_tokens(decoding, prefills, self.config.max_num_batched_tokens)

    def record_step_time(self, output: SchedulerOutput, seconds: float) -> None:
        if self.prefill_time_budget is not None:
            self.prefill_time_budget.record(output, seconds)

    def _chunk(self, remaining: int, budget: int) -> int:
        """Tokens to compute this step of a request with ``remaining`` uncomputed ones: what the
        budget allows, and at most ``long_prefill_token_threshold`` when that is set."""
        cap = self.config.long_prefill_token_threshold
        return min(remaining, budget, cap) if cap else min(remaining, budget)

    def _take_drafts(self, request: Request, num_new: int, budget: int) -> list[int]:
        """Consume ``request.draft_token_ids`` if a chunk of ``num_new`` tokens completes its
        sequence, returning those to verify with it: what ``budget`` leaves room for, keeping every
        position below ``max_model_len``, and no more than ``max_tokens`` can still use (the token
        after the last draft completes them)."""
        drafts = request.draft_token_ids
        if not drafts or request.num_computed_tokens + num_new < request.num_tokens:
            return []
        request.draft_token_ids = []
        max_tokens = request.sampling_params.max_tokens or self.max_model_len
        room = min(
            budget - num_new,
            self.max_model_len - request.num_tokens - 1,
            max_tokens - len(request.output_token_ids) - 1,
        )
        return drafts[: max(room, 0)]

    def _victim_for(self, request: Request) -> Request | None:
        """The running request that waiting ``request`` may preempt, per policy, if any."""
        if not self.running:
            return None
        victim = self.preemption_victim(self.running)
        return victim if self.may_preempt_for(request, victim) else None

    def update(self, output: SchedulerOutput, accepted: list[list[int]]) -> list[Request]:
        if len(accepted) != len(output.scheduled):
            raise ValueError(f"update: {len(accepted)} lists of accepted tokens for {len(output.scheduled)} scheduled")
        finished = []
        for item, tokens in zip(output.scheduled, accepted):
            request = item.request
            if request.status is not RequestStatus.RUNNING:
                continue  # aborted while the step ran
            _check_accepted(item, tokens)
            if not item.completes_sequence:
                request.num_computed_tokens += item.num_tokens
                continue
            for token in tokens:
                request.append_token(token, self.max_model_len)
                if request.status.finished:
                    break
            # The last token's KV comes next step; that of rejected drafts (or of drafts past a stop) is dropped.
            request.num_computed_tokens = request.num_tokens - 1
            if item.num_lookahead:
                self.kv_cache.truncate(request, request.num_computed_tokens)
            if request.status.finished:
                self.running.remove(request)
                self._finish(request, request.status)
                finished.append(request)
        return finished

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def num_waiting(self) -> int:
        return len(self.waiting)

    def num_running(self) -> int:
        return len(self.running)

    def arrival_order(self, request: Request) -> int:
        """How many requests this scheduler received before ``request`` (a waiting or running one)."""
        return self._arrival_index[request.request_id]

    def _preempt(self, request: Request, output: SchedulerOutput, scheduled: dict[str, ScheduledRequest]) -> int:
        """Recompute preemption: drop the KV, queue the request to prefill prompt + output again.

        Returns the tokens of this step's budget given back (if it was already scheduled).
        """
        self.running.remove(request)
        self.kv_cache.free(request)
        request.num_computed_tokens = 0
        request.draft_token_ids = []
        request.num_preemptions += 1
        request.status = RequestStatus.PREEMPTED
        bisect.insort(self.waiting, request, key=self._queue_key)
        output.preempted.append(request)
        item = scheduled.pop(request.request_id, None)
        return item.num_tokens if item else 0

    def _finish(self, request: Request, status: RequestStatus) -> None:
        self.kv_cache.free(request)
        self._arrival_index.pop(request.request_id, None)
        request.status = status


def _decoding(request: Request) -> bool:
    """Whether ``request``'s next chunk starts past its prompt (what ``ScheduledRequest.decodes`` will say)."""
    return request.num_computed_tokens >= request.num_prompt_tokens


def _check_accepted(item: ScheduledRequest, tokens: list[int]) -> None:
    """ValueError unless ``tokens`` can be ``item``'s accepted tokens (see ``Scheduler.update``)."""
    if not item.completes_sequence:
        if tokens:
            raise ValueError(
                f"update: {item.request.request_id!r} got tokens {tokens} for a chunk that does not complete "
                "its sequence"
            )
        return
    drafts = item.draft_token_ids
    if not 1 <= len(tokens) <= 1 + len(drafts) or tokens[:-1] != drafts[: len(tokens) - 1]:
        raise ValueError(
            f"update: {item.request.request_id!r} accepted {tokens} after verifying drafts {drafts}: expected "
            "the accepted drafts (a prefix of them) and then one sampled token"
        )
