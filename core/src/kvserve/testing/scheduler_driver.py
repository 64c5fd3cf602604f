"""Drive a Scheduler exactly as the engine does, checking the scheduler contract at every step.

The model is replaced by :func:`greedy_token`, a deterministic function of the whole token
sequence: like greedy decoding, the token after a given sequence is always the same, so a
request preempted and recomputed must produce the tokens it would have produced unpreempted,
and a request whose drafts are verified (lookahead, see :func:`draft_proposer`) the tokens it
would have produced one token per step.
"""

from __future__ import annotations

import random
import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvserve.interfaces import KVCacheManager, ScheduledRequest, Scheduler, SchedulerOutput
from kvserve.request import Request, RequestStatus
from kvserve.sampling_params import SamplingParams

EOS = 2
"""The EOS token id of generated requests (and a token :func:`greedy_token` can produce)."""


def greedy_token(tokens: Sequence[int], vocab: int) -> int:
    """The fake model: the "greedy" next token after ``tokens``."""
    return zlib.crc32(array("q", tokens).tobytes()) % vocab


def draft_proposer(
    vocab: int, seed: int, num_drafts: int = 3, *, always_right: bool = False
) -> Callable[[Request], list[int]]:
    """A fake proposer of ``num_drafts`` draft tokens: the request's true (greedy) continuation,
    right for its first ``0 .. num_drafts`` tokens (drawn at random; all of them if
    ``always_right``) and wrong after, so that verification accepts each possible number of them.
    True continuations hold stop tokens and EOS too, so stops and ``max_tokens`` fall inside drafts."""
    rng = random.Random(seed)

    def propose(request: Request) -> list[int]:
        tokens = request.token_ids(0, request.num_tokens)
        for _ in range(num_drafts):
            tokens.append(greedy_token(tokens, vocab))
        drafts = tokens[request.num_tokens :]
        right = num_drafts if always_right else rng.randint(0, num_drafts)
        for i in range(right, num_drafts):
            drafts[i] = (drafts[i] + rng.randrange(1, vocab)) % vocab  # any token but the true one
        return drafts

    return propose


class ContractViolation(AssertionError):
    """A scheduler broke its contract; the message says at which step and how."""


@dataclass
class Arrival:
    """A request of a workload: added before step ``step``, aborted before step ``abort_at`` if still
    live, and ready to run (``Request.ready_when``) from step ``ready_at`` on (None: at once)."""

    step: int
    request_id: str
    prompt: list[int]
    params: SamplingParams
    priority: int = 0
    abort_at: int | None = None
    ready_at: int | None = None


@dataclass
class Workload:
    """A generated scenario: the engine settings and the requests' arrivals."""

    arrivals: list[Arrival]
    max_num_batched_tokens: int
    max_num_seqs: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    usable_blocks: int
    long_prefill_token_threshold: int = 0
    max_decode_slowdown: float = 0
    block_size: int = 4
    max_model_len: int = 48
    vocab: int = 32

    def with_(self, **changes: Any) -> Workload:
        """A copy with some fields changed (e.g. a roomier cache, no aborts)."""
        return Workload(**{**self.__dict__, **changes})


def random_workload(seed: int, *, tiny_cache: bool = True, aborts: int = 2, num_requests: int = 14) -> Workload:
    """Random arrivals, prompt lengths, output lengths, stop conditions, priorities and aborts.

    Even seeds use chunked prefill with a small token budget, odd ones whole-prompt prefill;
    seeds ``0, 1`` mod 4 turn prefix caching on, with prompts that share prefixes. A tiny
    cache holds little more than one full-length sequence, which forces preemption.
    """
    rng = random.Random(seed)
    block_size, max_model_len, vocab = 4, 48, 32
    chunked = seed % 2 == 0
    prefix = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 16))]
    arrivals = []
    for i in range(num_requests):
        prompt_len = rng.randint(1, 30)
        prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        if rng.random() < 0.5:
            prompt = (prefix + prompt)[:prompt_len]
        params = SamplingParams(
            max_tokens=None if rng.random() < 0.15 else rng.randint(1, 20),
            ignore_eos=rng.random() < 0.5,
            stop_token_ids=[rng.randrange(vocab)] if rng.random() < 0.2 else [],
        )
        step = rng.randint(0, 30)
        arrivals.append(Arrival(step, f"r{i}", prompt, params, priority=rng.randint(0, 3)))
    for arrival in rng.sample(arrivals, aborts):
        arrival.abort_at = arrival.step + rng.randint(0, 12)
    blocks_per_seq = max_model_len // block_size
    return Workload(
        arrivals=arrivals,
        max_num_batched_tokens=rng.choice([8, 16, 32]) if chunked else 64,
        max_num_seqs=rng.choice([2, 4, 8]),
        enable_chunked_prefill=chunked,
        enable_prefix_caching=seed % 4 in (0, 1),
        usable_blocks=blocks_per_seq + rng.randint(0, 4) if tiny_cache else 16 * blocks_per_seq,
        block_size=block_size,
        max_model_len=max_model_len,
        vocab=vocab,
    )


@dataclass
class RunResult:
    """What a run produced, for assertions beyond the per-step invariants."""

    requests: dict[str, Request] = field(default_factory=dict)
    """Every request added, by id."""
    outputs: dict[str, list[int]] = field(default_factory=dict)
    """Output tokens of every request that finished (not aborted)."""
    statuses: dict[str, RequestStatus] = field(default_factory=dict)
    admissions: list[str] = field(default_factory=list)
    """Request ids in the order they were admitted (again after each preemption)."""
    preemptions: list[str] = field(default_factory=list)
    victims_checked: int = 0
    steps: int = 0
    drafts_verified: int = 0
    drafts_accepted: int = 0


class SchedulerDriver:
    """Runs ``scheduler`` over a workload the way ``LLMEngine.step`` does and checks, at every step:

    - the plan stays within ``max_num_batched_tokens``, ``max_num_seqs`` and (per request)
      ``long_prefill_token_threshold``, schedules each
      request at most once, with at least one token, contiguous with what it has computed,
      and with KV blocks allocated for every scheduled token; without chunked prefill, every
      chunk reaches the end of its sequence;
    - no block leaks: free blocks plus the distinct blocks running requests hold is always
      every usable block, and after aborts, finishes and preemptions the blocks come back;
    - the KV a sampling request reads through its block table holds its own tokens: the fake
      model records which token each scheduled chunk writes to each slot, so a block reused
      (prefix caching) before or without being computed, or overwritten, is caught;
    - admissions follow ``policy_key`` (smaller first; optional) and each preemption victim is
      ``expected_victim(running in admission order)`` (optional);
    - ``update`` appends each sampled token, finishes requests exactly when a stop condition
      holds, and returns each finished request once; aborted requests are never scheduled again;
    - requests are admitted only once ready (``Request.ready_when``);
    - with a ``proposer`` (called after each step for every request that sampled, to set its
      ``draft_token_ids``): a chunk verifies only a prefix of its request's drafts, only when it
      completes the sequence, with every position below ``max_model_len`` and no more than
      ``max_tokens`` can use; the fake model verifies them greedily (reading the drafts' KV through
      the block table), ``update`` appends the accepted ones up to the first stop, and afterwards
      the request holds blocks for its computed tokens only (rejected drafts' slots given back);
      a preempted request has no drafts;
    - at the end, every request that was not aborted has finished and every block is free.

    Given ``step_seconds`` (a plan's duration on a made-up clock), each step's time is reported
    with ``record_step_time`` after ``update``, as the engine reports the time it measured.

    A broken rule raises :class:`ContractViolation` naming the step, the request and the rule.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        vocab: int = 32,
        policy_key: Callable[[Request], Any] | None = None,
        expected_victim: Callable[[list[Request]], Request | None] | None = None,
        max_steps: int = 5000,
        step_seconds: Callable[[SchedulerOutput], float] | None = None,
        proposer: Callable[[Request], list[int]] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.proposer = proposer
        self.kv: KVCacheManager = scheduler.kv_cache
        self.config = scheduler.config
        self.vocab = vocab
        self.policy_key = policy_key
        self.expected_victim = expected_victim
        self.max_steps = max_steps
        self.step_seconds = step_seconds
        self.live: dict[str, Request] = {}
        self.running: list[Request] = []
        """Admitted requests in admission order (the driver's own bookkeeping, not the scheduler's)."""
        self.computed: dict[str, int] = {}
        self.ready_at: dict[str, int] = {}
        """Request id -> the step from which the request is ready (only for requests held back at first)."""
        self.kv_content: dict[int, int] = {}
        """Cache slot -> the token whose KV the fake model wrote there (what attention would read)."""
        self.result = RunResult()
        self.step_index = 0
        self._arrival_clock = 0.0
        self._usable = self.kv.num_free_blocks()

    # -- public ----------------------------------------------------------------------------
    def add(self, arrival: Arrival, eos_token_ids: tuple[int, ...] = (EOS,)) -> Request:
        """Add a request as the engine would (arrival times strictly increase with add order)."""
        self._arrival_clock += 1.0
        request = Request(
            arrival.request_id,
            list(arrival.prompt),
            arrival.params,
            eos_token_ids,
            arrival_time=self._arrival_clock,
            priority=arrival.priority,
        )
        if arrival.ready_at is not None:
            ready_at = self.ready_at[request.request_id] = arrival.ready_at
            request.ready_when = lambda: self.step_index >= ready_at
        self.scheduler.add_request(request)
        self.live[request.request_id] = request
        self.result.requests[request.request_id] = request
        self._check_counts("add_request")
        return request

    def abort(self, request_id: str) -> Request | None:
        """Abort like the engine: the scheduler must return the live request and free its blocks."""
        expected = self.live.get(request_id)
        returned = self.scheduler.abort_request(request_id)
        if returned is not expected:
            self._fail(f"abort_request({request_id!r}) returned {returned!r}, expected the live request {expected!r}")
        if expected is None:
            return None
        if expected.status is not RequestStatus.FINISHED_ABORTED:
            self._fail(f"aborted {request_id} has status {expected.status.name}, expected FINISHED_ABORTED")
        self._forget(expected)
        self.result.statuses[request_id] = expected.status
        self._check_blocks(f"aborting {request_id}")
        self._check_counts(f"aborting {request_id}")
        return expected

    def step(self) -> SchedulerOutput:
        """One engine step: ``schedule``, the fake model, ``update``; every check in between."""
        self.step_index += 1
        self.result.steps = self.step_index
        if self.step_index > self.max_steps:
            self._fail(f"no end after {self.max_steps} steps: {self._state()}")
        waiting_before = [r for r in self.live.values() if r not in self.running]
        running_before = list(self.running)
        drafts_before = {rid: list(r.draft_token_ids) for rid, r in self.live.items()}
        plan = self.scheduler.schedule()
        self._check_preemptions(plan, running_before)
        admitted = self._check_plan(plan, drafts_before)
        self._check_policy_order(admitted, waiting_before)
        self._check_blocks("schedule()")
        completes = [item.completes_sequence for item in plan.scheduled]  # before update() appends
        for item in plan.scheduled:  # the runner writes every scheduled token's KV before any read
            slots = self._slots(item.request, item.start, item.start + item.num_tokens)
            self.kv_content.update(zip(slots, item.token_ids()))
        accepted = [self._verify(item) if done else [] for item, done in zip(plan.scheduled, completes)]
        self.result.drafts_verified += sum(item.num_lookahead for item in plan.scheduled)
        self.result.drafts_accepted += sum(max(len(tokens) - 1, 0) for tokens in accepted)
        before = {item.request.request_id: len(item.request.output_token_ids) for item in plan.scheduled}
        finished = self.scheduler.update(plan, accepted)
        self._check_update(plan, accepted, completes, before, finished)
        self._check_blocks("update()")
        self._check_counts("update()")
        if self.step_seconds is not None:
            self.scheduler.record_step_time(plan, self.step_seconds(plan))
        if self.proposer is not None:
            for item, done in zip(plan.scheduled, completes):
                if done and item.request.request_id in self.live:
                    item.request.draft_token_ids = self.proposer(item.request)
        return plan

    def run(self, arrivals: list[Arrival]) -> RunResult:
        """Add requests at their arrival steps, abort at their abort steps, step until all are done."""
        pending = sorted(arrivals, key=lambda a: a.step)
        aborts = {a.request_id: a.abort_at for a in arrivals if a.abort_at is not None}
        idle = 0
        while pending or self.scheduler.has_unfinished():
            while pending and pending[0].step <= self.step_index:
                self.add(pending.pop(0))
            for request_id, at in list(aborts.items()):
                if at <= self.step_index and request_id in self.live:
                    self.abort(request_id)
                    del aborts[request_id]
            if not self.scheduler.has_unfinished():
                if self.live:
                    self._fail(f"has_unfinished() is False while {sorted(self.live)} are live")
                self.step_index += 1  # nothing to do until the next arrival
                continue
            plan = self.step()
            idle = 0 if plan.scheduled else idle + 1
            if idle > 3 and not pending:
                self._fail(f"stalled: {idle} steps in a row scheduled nothing; {self._state()}")
        self._check_done()
        return self.result

    def _slots(self, request: Request, start: int, end: int) -> list[int]:
        table, size = self.kv.block_table(request.request_id), self.kv.block_size
        return [table[p // size] * size + p % size for p in range(start, end)]

    def _verify(self, item: ScheduledRequest) -> list[int]:
        """The fake model and a greedy verifier for a chunk that completes its sequence: the accepted
        drafts (those equal to the model's token after the tokens before them), then the model's
        token after them; read through the KV cache."""
        request, end = item.request, item.start + item.num_tokens
        tokens = request.token_ids(0, item.start) + item.token_ids()
        seen = [self.kv_content.get(slot) for slot in self._slots(request, 0, end)]
        if seen != tokens:
            position = next(p for p, (a, b) in enumerate(zip(seen, tokens)) if a != b)
            self._fail(
                f"{request.request_id} would attend to wrong KV: its block table maps token {position} "
                f"({tokens[position]}) to a slot holding {seen[position]!r} (a reused block that was "
                "never computed, or overwritten)"
            )
        known = end - item.num_lookahead
        accepted = []
        for draft in item.draft_token_ids:
            target = greedy_token(tokens[: known + len(accepted)], self.vocab)
            if draft != target:
                break
            accepted.append(draft)
        return accepted + [greedy_token(tokens[: known + len(accepted)], self.vocab)]

    # -- checks ----------------------------------------------------------------------------
    def _check_preemptions(self, plan: SchedulerOutput, running_before: list[Request]) -> None:
        candidates = list(running_before)
        for victim in plan.preempted:
            rid = victim.request_id
            if victim not in self.running:
                self._fail(f"preempted {rid}, which was not running")
            if self.expected_victim is not None and victim in candidates:
                expected = self.expected_victim(list(candidates))
                if expected is not None:
                    self.result.victims_checked += 1
                    if expected is not victim:
                        self._fail(
                            f"preempted {rid} but the policy's victim among running "
                            f"{[r.request_id for r in candidates]} (admission order) is {expected.request_id}"
                        )
            if victim in candidates:
                candidates.remove(victim)
            if victim.status.finished or victim.num_computed_tokens != 0 or victim.draft_token_ids:
                self._fail(
                    f"preempted {rid} must wait for recomputation (status {victim.status.name}, "
                    f"{victim.num_computed_tokens} computed tokens, drafts {victim.draft_token_ids}; "
                    "expected PREEMPTED/WAITING with 0 and no drafts)"
                )
            self.running.remove(victim)
            self.computed[rid] = 0
            self.result.preemptions.append(rid)

    def _check_plan(self, plan: SchedulerOutput, drafts_before: dict[str, list[int]]) -> list[Request]:
        """Budget, sequence count, chunk positions, drafts and block coverage; returns the newly admitted requests."""
        budget, max_seqs = self.config.max_num_batched_tokens, self.config.max_num_seqs
        if plan.num_batched_tokens > budget:
            self._fail(
                f"scheduled {plan.num_batched_tokens} tokens, over max_num_batched_tokens={budget} "
                f"({', '.join(f'{s.request.request_id}:{s.num_tokens}' for s in plan.scheduled)})"
            )
        ids = [item.request.request_id for item in plan.scheduled]
        if len(set(ids)) != len(ids):
            self._fail(f"scheduled a request twice in one step: {ids}")
        admitted = []
        for item in plan.scheduled:
            request, rid = item.request, item.request.request_id
            if self.live.get(rid) is not request:
                self._fail(f"scheduled {rid}, which is {request.status.name} (not a live request)")
            if item.num_tokens <= item.num_lookahead or item.start + item.num_tokens - item.num_lookahead > (
                request.num_tokens
            ):
                self._fail(
                    f"{rid}: chunk of {item.num_tokens} tokens ({item.num_lookahead} drafts) from {item.start} "
                    f"is outside its {request.num_tokens} tokens"
                )
            self._check_drafts(item, drafts_before.get(rid, []))
            if self.step_index < self.ready_at.get(rid, 0):
                self._fail(f"{rid} was scheduled before it was ready (Request.ready_when)")
            if request in self.running:
                if item.start != self.computed[rid]:
                    self._fail(
                        f"{rid} resumes at token {item.start} but {self.computed[rid]} of its tokens are computed"
                    )
            else:
                self._check_admission_start(item.start, request)
                admitted.append(request)
                self.running.append(request)
                self.result.admissions.append(rid)
            if not self.config.enable_chunked_prefill and not item.completes_sequence:
                self._fail(f"{rid}: a partial chunk ({item.num_tokens} tokens) although chunked prefill is off")
            cap = self.config.long_prefill_token_threshold
            if cap and item.num_tokens - item.num_lookahead > cap:
                self._fail(f"{rid}: a chunk of {item.num_tokens} tokens, over long_prefill_token_threshold={cap}")
            blocks = self.kv.block_table(rid)
            if len(blocks) * self.kv.block_size < item.start + item.num_tokens:
                self._fail(
                    f"{rid} computes tokens up to {item.start + item.num_tokens} but holds only "
                    f"{len(blocks)} blocks of {self.kv.block_size}: allocate_slots was not called for them"
                )
        if len(plan.scheduled) > max_seqs or len(self.running) > max_seqs:
            self._fail(
                f"{len(plan.scheduled)} scheduled / {len(self.running)} running requests, over max_num_seqs={max_seqs}"
            )
        return admitted

    def _check_drafts(self, item: ScheduledRequest, proposed: list[int]) -> None:
        rid, k = item.request.request_id, item.num_lookahead
        if not k:
            return
        request, params = item.request, item.request.sampling_params
        if not item.completes_sequence or item.draft_token_ids != proposed[:k]:
            self._fail(
                f"{rid}: verifies drafts {item.draft_token_ids} (proposed {proposed}) in a chunk that "
                f"{'completes' if item.completes_sequence else 'does not complete'} its sequence: only a "
                "prefix of the proposed drafts, and only with the last known token"
            )
        if item.start + item.num_tokens >= self.scheduler.max_model_len:
            self._fail(
                f"{rid}: drafts up to position {item.start + item.num_tokens - 1}, max_model_len is "
                f"{self.scheduler.max_model_len}: the token after the last draft would be past it"
            )
        max_tokens = params.max_tokens or self.scheduler.max_model_len
        if len(request.output_token_ids) + k >= max_tokens:
            self._fail(
                f"{rid}: {k} drafts after {len(request.output_token_ids)} output tokens, "
                f"max_tokens={max_tokens}: the token after the last draft would be past it"
            )

    def _check_admission_start(self, start: int, request: Request) -> None:
        if start == 0:
            return
        caching = self.kv.enable_prefix_caching
        if not caching or start % self.kv.block_size or start >= request.num_tokens:
            self._fail(
                f"{request.request_id} admitted at token {start}: only whole cached blocks "
                f"(prefix caching {'on' if caching else 'off'}), and never the last token, may be skipped"
            )

    def _check_policy_order(self, admitted: list[Request], waiting_before: list[Request]) -> None:
        if self.policy_key is None or not admitted:
            return
        key = self.policy_key
        for earlier, later in zip(admitted, admitted[1:]):
            if key(later) < key(earlier):
                self._fail(
                    f"admitted {earlier.request_id} (policy key {key(earlier)!r}) before "
                    f"{later.request_id} (policy key {key(later)!r}) in the same step"
                )
        last = max(admitted, key=key)
        for request in waiting_before:
            ready = self.step_index >= self.ready_at.get(request.request_id, 0)
            if request not in admitted and ready and key(request) < key(last):
                self._fail(
                    f"admitted {last.request_id} (policy key {key(last)!r}) while {request.request_id} "
                    f"(policy key {key(request)!r}) kept waiting: admission order violates the policy"
                )

    def _check_update(
        self,
        plan: SchedulerOutput,
        accepted: list[list[int]],
        completes: list[bool],
        before: dict[str, int],
        finished: list[Request],
    ) -> None:
        finished_ids = [r.request_id for r in finished]
        if len(set(finished_ids)) != len(finished_ids):
            self._fail(f"update() returned a finished request twice: {finished_ids}")
        for request in finished:
            if request not in self.running or not request.status.finished:
                self._fail(f"update() returned {request.request_id} ({request.status.name}) as finished")
        for item, tokens, done in zip(plan.scheduled, accepted, completes):
            request, rid = item.request, item.request.request_id
            expected, stops = self._appended(request, before[rid], tokens)
            appended = request.output_token_ids[before[rid] :]
            if appended != expected:
                self._fail(
                    f"update() must append the accepted tokens to {rid} up to the first stop, exactly when "
                    f"its chunk completes the sequence (completes: {done}, accepted {tokens}, expected "
                    f"{expected} appended, got {appended})"
                )
            if stops != (request in finished):
                self._fail(
                    f"{rid} {'met' if stops else 'did not meet'} a stop condition "
                    f"(output {len(request.output_token_ids)} tokens, last {request.output_token_ids[-1:]}) "
                    f"but update() {'did not return' if stops else 'returned'} it as finished"
                )
            self.computed[rid] = request.num_tokens - 1 if done else item.start + item.num_tokens
            if stops:
                continue
            if request.num_computed_tokens != self.computed[rid]:
                self._fail(
                    f"{rid} has {request.num_computed_tokens} computed tokens after update(), expected "
                    f"{self.computed[rid]} (rejected drafts' KV does not count)"
                )
            held = len(self.kv.block_table(rid))
            if item.num_lookahead and held != -(-request.num_computed_tokens // self.kv.block_size):
                self._fail(
                    f"{rid} holds {held} blocks after verifying drafts, for {request.num_computed_tokens} "
                    "computed tokens: the slots of rejected drafts must be given back (KVCacheManager.truncate)"
                )
        for request in finished:
            self.result.outputs[request.request_id] = list(request.output_token_ids)
            self.result.statuses[request.request_id] = request.status
            self._forget(request)

    def _appended(self, request: Request, num_before: int, tokens: list[int]) -> tuple[list[int], bool]:
        """The tokens ``update`` must append to ``request`` (which had ``num_before`` output tokens)
        given ``tokens`` accepted, and whether the last of them ends it (EOS, stop token,
        ``max_tokens``, ``max_model_len``)."""
        params, max_model_len = request.sampling_params, self.scheduler.max_model_len
        max_tokens = params.max_tokens or max_model_len
        for count, token in enumerate(tokens, 1):
            num_output = num_before + count
            if (
                token in params.stop_token_ids
                or (token in request.eos_token_ids and not params.ignore_eos)
                or num_output >= max_tokens
                or request.num_prompt_tokens + num_output >= max_model_len
            ):
                return tokens[:count], True
        return list(tokens), False

    def _check_blocks(self, after: str) -> None:
        held = {block for r in self.running for block in self.kv.block_table(r.request_id)}
        free = self.kv.num_free_blocks()
        if 0 in held:
            self._fail(f"after {after}: a running request holds the null block 0")
        if free + len(held) != self._usable:
            what = "leaked" if free + len(held) < self._usable else "double counted"
            self._fail(
                f"after {after}: {free} free blocks + {len(held)} held by running requests != "
                f"{self._usable} usable blocks: blocks {what}"
            )

    def _check_counts(self, after: str) -> None:
        waiting, running = self.scheduler.num_waiting(), self.scheduler.num_running()
        if (waiting, running) != (len(self.live) - len(self.running), len(self.running)):
            self._fail(
                f"after {after}: num_waiting()={waiting}, num_running()={running}, but "
                f"{len(self.live) - len(self.running)} requests wait and {len(self.running)} run"
            )

    def _check_done(self) -> None:
        if self.live:
            self._fail(f"requests never finished: {sorted(self.live)}")
        free = self.kv.num_free_blocks()
        if free != self._usable:
            self._fail(f"after every request ended, {self._usable - free} of {self._usable} blocks are still held")

    # -- helpers ---------------------------------------------------------------------------
    def _forget(self, request: Request) -> None:
        self.live.pop(request.request_id, None)
        if request in self.running:
            self.running.remove(request)

    def _state(self) -> str:
        return (
            f"{len(self.live) - len(self.running)} waiting, running {[r.request_id for r in self.running]}, "
            f"{self.kv.num_free_blocks()} free blocks"
        )

    def _fail(self, message: str) -> None:
        raise ContractViolation(f"step {self.step_index}: {message}")
