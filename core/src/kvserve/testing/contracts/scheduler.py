"""The Scheduler contract: budgets, liveness, no leaks, policy order, and preemption that changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from kvserve.config import SchedulerConfig
from kvserve.interfaces import Scheduler
from kvserve.plugins import load_component
from kvserve.request import Request, RequestStatus
from kvserve.sampling_params import SamplingParams
from kvserve.scheduling import BatchingScheduler, DistinctKeyLimit
from kvserve.scheduling.prefill_time_budget import split_tokens
from kvserve.testing.contracts._base import ComponentContract, reported_as
from kvserve.testing.scheduler_driver import Arrival, SchedulerDriver, Workload, draft_proposer, random_workload


class SchedulerContract(ComponentContract):
    """Every scheduler plugin must pass this. Subclass it and name the scheduler::

        class TestMyScheduler(SchedulerContract):
            scheduler = "my_policy"

    The scheduler is built like the engine builds it, ``cls(SchedulerConfig(...), kv_cache_manager,
    max_model_len)``, over the KV cache manager named by :attr:`kv_cache_manager`, and driven
    by :class:`~kvserve.testing.scheduler_driver.SchedulerDriver` with a deterministic fake model.
    The driver checks every step (budgets, block coverage, no leaks, stop conditions...); the
    tests below feed it generated workloads: random arrivals, prompt and output lengths, stop
    tokens, aborts, prefix sharing, and KV caches so small that requests must be preempted.

    The policy is stated by two optional hooks, :meth:`policy_key` (admission order) and
    :meth:`expected_victim` (preemption). For a :class:`~kvserve.scheduling.BatchingScheduler`
    they default to the scheduler's own ``admission_key`` / ``preemption_victim``, which checks
    that the machinery follows the policy; override them to state the policy independently
    (FIFO: arrival order, the latest admitted is preempted), which checks the policy itself.

    ``--kvserve-seeds N`` sets how many random workloads each property test runs (default 4).
    """

    kind = "scheduler"
    interface = Scheduler
    scheduler: ClassVar[str]
    """Registry name of the scheduler under test."""
    kv_cache_manager: ClassVar[str] = "paged"
    """Registry name of the KV cache manager the scheduler runs over (core's by default)."""

    # -- policy hooks ----------------------------------------------------------------------
    def policy_key(self, scheduler: Any, request: Request) -> Any:
        """Sort key of the admission order: of the requests waiting at the same time, those with
        smaller keys must be admitted first.

        Generated requests have distinct ``arrival_time`` values increasing with arrival order
        and a random ``priority`` in ``0..3``. Without an override, only a BatchingScheduler
        has a known order (its ``admission_key``, ties by arrival); for others it is not checked.
        """
        return (scheduler.admission_key(request), request.arrival_time)

    def expected_victim(self, scheduler: Any, running: list[Request]) -> Request:
        """The request the policy preempts first when blocks run out, given the running requests
        in admission order. Without an override, only a BatchingScheduler's choice (its
        ``preemption_victim``) is known; for others it is not checked."""
        return scheduler.preemption_victim(list(running))

    def states_policy(self, scheduler: Any, hook: str) -> bool:
        """Whether ``hook`` (``"policy_key"`` or ``"expected_victim"``) is known for ``scheduler``."""
        overridden = getattr(type(self), hook) is not getattr(SchedulerContract, hook)
        return overridden or isinstance(scheduler, BatchingScheduler)

    # -- helpers ---------------------------------------------------------------------------
    def make_scheduler(self, component: type, workload: Workload) -> Any:
        """The scheduler under test over a fresh KV cache manager sized for ``workload``."""
        manager_cls = load_component("kv_cache_manager", self.kv_cache_manager)
        manager = manager_cls(workload.usable_blocks + 1, workload.block_size, workload.enable_prefix_caching)
        config = SchedulerConfig(
            scheduler=self.scheduler,
            max_num_seqs=workload.max_num_seqs,
            max_num_batched_tokens=workload.max_num_batched_tokens,
            enable_chunked_prefill=workload.enable_chunked_prefill,
            long_prefill_token_threshold=workload.long_prefill_token_threshold,
            max_decode_slowdown=workload.max_decode_slowdown,
        )
        return component(config, manager, workload.max_model_len)

    def run_workload(
        self,
        component: type,
        workload: Workload,
        *,
        check_policy: bool = True,
        proposer: Callable[[Request], list[int]] | None = None,
    ) -> tuple[Any, Any]:
        """Run ``workload`` through a fresh scheduler (with drafts from ``proposer``, if given); a broken
        rule fails the test with the driver's message."""
        scheduler = self.make_scheduler(component, workload)
        order = check_policy and self.states_policy(scheduler, "policy_key")
        victim = check_policy and self.states_policy(scheduler, "expected_victim")
        driver = SchedulerDriver(
            scheduler,
            vocab=workload.vocab,
            policy_key=(lambda r: self.policy_key(scheduler, r)) if order else None,
            expected_victim=(lambda running: self.expected_victim(scheduler, running)) if victim else None,
            proposer=proposer,
        )
        with reported_as(f"scheduler {self.scheduler!r}"):
            return driver.run(workload.arrivals), scheduler

    # -- tests -----------------------------------------------------------------------------
    def test_random_workload_keeps_every_invariant(self, component, seed):
        """Random arrivals and aborts over a tiny KV cache: at every step the token budget and
        ``max_num_seqs`` hold, every scheduled token has a block, no block leaks, admissions and
        preemption victims follow the policy; in the end every request that was not aborted has
        finished with its stop condition and every block is free again."""
        self.run_workload(component, random_workload(seed))

    def test_preempted_requests_resume_with_the_same_greedy_tokens(self, component, seed):
        """Recompute preemption is invisible in the output: with a KV cache so small that requests
        are preempted, every request produces exactly the tokens it produces with a roomy cache."""
        workload = random_workload(seed, aborts=0).with_(arrivals=[_long_arrival(i, seed) for i in range(8)])
        tiny, _ = self.run_workload(component, workload)
        roomy, _ = self.run_workload(component, workload.with_(usable_blocks=200))
        if not tiny.preemptions:
            pytest.skip(f"scheduler {self.scheduler!r} never preempted, even with a tiny KV cache")
        for rid, tokens in roomy.outputs.items():
            assert tiny.outputs.get(rid) == tokens, (
                f"{rid} produced different tokens after preemption: {tiny.outputs.get(rid)} "
                f"instead of {tokens} (preempted {tiny.preemptions.count(rid)} times)"
            )

    def test_preemption_victims_follow_the_policy(self, component, seed):
        """When blocks run out, the request preempted is the one the policy names
        (:meth:`expected_victim`), chosen among the running requests in admission order."""
        workload = random_workload(seed, aborts=0).with_(arrivals=[_long_arrival(i, seed) for i in range(8)])
        result, scheduler = self.run_workload(component, workload)
        if not self.states_policy(scheduler, "expected_victim"):
            pytest.skip("the policy states no preemption victim (override expected_victim to check it)")
        if not result.victims_checked:
            pytest.skip(f"scheduler {self.scheduler!r} never preempted, even with a tiny KV cache")

    def test_admission_follows_policy_order(self, component, seed):
        """Requests that wait together are admitted in :meth:`policy_key` order (one or two slots at a time)."""
        workload = random_workload(seed, tiny_cache=False, aborts=0).with_(max_num_seqs=1 + seed % 2)
        arrivals = [Arrival(0, a.request_id, a.prompt, a.params, a.priority) for a in workload.arrivals]
        result, scheduler = self.run_workload(component, workload.with_(arrivals=arrivals))
        if not self.states_policy(scheduler, "policy_key"):
            pytest.skip("the policy states no admission order (override policy_key to check it)")
        requests = result.requests
        expected = sorted(requests, key=lambda rid: self.policy_key(scheduler, requests[rid]))
        assert result.admissions == expected, (
            f"admission order {result.admissions} differs from the policy's order {expected}"
        )

    def test_abort_frees_blocks_and_forgets_the_request(self, component):
        """``abort_request`` returns the waiting or running request, frees its blocks at once,
        never schedules it again, and returns None for unknown or already aborted ids."""
        workload = random_workload(0, tiny_cache=False, aborts=0).with_(max_num_seqs=2, arrivals=[])
        scheduler = self.make_scheduler(component, workload)
        driver = SchedulerDriver(scheduler, vocab=workload.vocab)
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        for i in range(3):
            driver.add(Arrival(0, f"a{i}", [5 + i] * 10, params))
        with reported_as(f"scheduler {self.scheduler!r}"):
            driver.step()
            running = driver.running[0].request_id
            waiting = next(rid for rid in driver.live if rid not in {r.request_id for r in driver.running})
            driver.abort(running)  # checks the returned request, its status and the freed blocks
            driver.abort(waiting)
            assert scheduler.abort_request(running) is None, "aborting twice must return None"
            assert scheduler.abort_request("never-added") is None, "aborting an unknown id must return None"
            while scheduler.has_unfinished():
                driver.step()  # checks that the aborted requests are never scheduled

    def test_long_prompt_is_chunked_within_the_budget(self, component):
        """With chunked prefill, a prompt longer than the token budget is computed in contiguous
        chunks that fit the budget, and a token is sampled only once the whole prompt is computed."""
        workload = random_workload(0, tiny_cache=False, aborts=0).with_(max_num_batched_tokens=8)
        scheduler = self.make_scheduler(component, workload)
        driver = SchedulerDriver(scheduler, vocab=workload.vocab)
        request = driver.add(Arrival(0, "long", list(range(3, 33)), SamplingParams(max_tokens=2, ignore_eos=True)))
        chunks = []
        with reported_as(f"scheduler {self.scheduler!r}"):
            while scheduler.has_unfinished():
                plan = driver.step()  # checks budget, contiguity and that only the last chunk samples
                chunks += [item.num_tokens for item in plan.scheduled]
        assert sum(chunks[:-1]) == 30 and all(n <= 8 for n in chunks), f"prompt chunks {chunks} (budget 8)"
        assert request.status is RequestStatus.FINISHED_LENGTH and len(request.output_token_ids) == 2

    def test_long_prefill_threshold_caps_each_chunk_not_the_step(self, component):
        """``long_prefill_token_threshold`` caps each request's chunk per step, while the step's
        budget still takes several requests' chunks; decodes are unaffected."""
        workload = random_workload(0, tiny_cache=False, aborts=0).with_(
            max_num_batched_tokens=32, max_num_seqs=4, long_prefill_token_threshold=5
        )
        scheduler = self.make_scheduler(component, workload)
        driver = SchedulerDriver(scheduler, vocab=workload.vocab)
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        for i in range(3):
            driver.add(Arrival(0, f"long{i}", [3 + i] * 12, params))
        plans = []
        with reported_as(f"scheduler {self.scheduler!r}"):
            while scheduler.has_unfinished():
                plans.append(driver.step())  # the driver fails any chunk over the cap
        first = sorted(item.num_tokens for item in plans[0].scheduled)
        assert first == [5, 5, 5], f"first step's chunks {first}: three prompts, each capped at 5"
        assert all(len(r.output_token_ids) == 3 for r in driver.result.requests.values())

    def test_max_decode_slowdown_keeps_steps_that_decode_within_it(self, component):
        """With ``max_decode_slowdown=2`` and step times from a made-up cost (a decode-only step
        1 s, each prefill token 0.25 s more), a prompt arriving while others decode is computed in
        chunks that keep every step that decodes within 2 s; the limit is learnt from the reported
        times (chunks grow to the 4 tokens it allows), and the prompt completes."""
        workload = random_workload(0, tiny_cache=False, aborts=0).with_(
            max_num_batched_tokens=32, max_num_seqs=4, max_decode_slowdown=2.0
        )
        scheduler = self.make_scheduler(component, workload)

        def seconds(plan):
            return 1.0 + 0.25 * split_tokens(plan)[1]

        driver = SchedulerDriver(scheduler, vocab=workload.vocab, step_seconds=seconds)
        for i in range(2):
            driver.add(Arrival(0, f"decode{i}", [3 + i] * 4, SamplingParams(max_tokens=30, ignore_eos=True)))
        chunks, decoding_steps = [], []
        with reported_as(f"scheduler {self.scheduler!r}"):
            driver.step()  # both prompts: nothing decodes yet, so no limit
            driver.step()  # decode-only: the reference time
            long = driver.add(Arrival(0, "long", [9] * 24, SamplingParams(max_tokens=2, ignore_eos=True)))
            while scheduler.has_unfinished():
                plan = driver.step()
                decodes, prefill = split_tokens(plan)
                if decodes and prefill:
                    chunks.append(prefill)
                    decoding_steps.append(seconds(plan))
        assert decoding_steps and max(decoding_steps) <= 2.0, f"steps that decode took {decoding_steps} s (limit 2 s)"
        assert sum(chunks) == 24 and max(chunks) == 4, f"the prompt's chunks {chunks}: at most 4 tokens, learnt"
        assert long.status is RequestStatus.FINISHED_LENGTH and len(long.output_token_ids) == 2

    @pytest.mark.parametrize(("prompt_len", "expected"), [(6, 18), (12, 2)], ids=["burst", "too_long"])
    def test_max_decode_slowdown_lets_a_burst_that_outnumbers_the_decodes_through(
        self, component, prompt_len, expected
    ):
        """With ``max_decode_slowdown=2`` and the same made-up cost, three prompts arriving beside one
        decoding request are admitted whole in one step when the token budget (32) takes them all
        (three of 6 tokens: 18), as they outnumber the decodes; three of 12 tokens, which no one step
        takes, are held to the limit: 2 tokens, at the 0.5 s a token of the first step (the decoding
        request's 4-token prompt alone, 2 s) against the 1 s the decode-only step took."""
        workload = random_workload(0, tiny_cache=False, aborts=0).with_(
            max_num_batched_tokens=32, max_num_seqs=4, max_decode_slowdown=2.0
        )
        scheduler = self.make_scheduler(component, workload)
        driver = SchedulerDriver(
            scheduler, vocab=workload.vocab, step_seconds=lambda plan: 1.0 + 0.25 * split_tokens(plan)[1]
        )
        driver.add(Arrival(0, "decode", [3] * 4, SamplingParams(max_tokens=30, ignore_eos=True)))
        with reported_as(f"scheduler {self.scheduler!r}"):
            driver.step()  # the prompt
            driver.step()  # decode-only: the reference time
            for i in range(3):
                driver.add(Arrival(0, f"p{i}", [5 + i] * prompt_len, SamplingParams(max_tokens=2, ignore_eos=True)))
            plan = driver.step()
        assert split_tokens(plan) == (1, expected), f"(decodes, prefill tokens) {split_tokens(plan)}"

    def test_without_chunked_prefill_a_prompt_runs_whole(self, component):
        """Without chunked prefill, each prompt is computed in one chunk within the budget."""
        workload = random_workload(1, tiny_cache=False, aborts=0).with_(
            enable_chunked_prefill=False, max_num_batched_tokens=48
        )
        self.run_workload(component, workload)  # the driver rejects any partial chunk

    def test_requests_stop_at_max_model_len(self, component):
        """A request without ``max_tokens`` finishes with status length when it reaches ``max_model_len``."""
        workload = random_workload(0, tiny_cache=False, aborts=0)
        arrival = Arrival(0, "to-the-end", [7] * 40, SamplingParams(max_tokens=None, ignore_eos=True))
        result, _ = self.run_workload(component, workload.with_(arrivals=[arrival]))
        assert result.statuses["to-the-end"] is RequestStatus.FINISHED_LENGTH
        assert len(result.outputs["to-the-end"]) == workload.max_model_len - 40

    # -- multi-token steps, held requests, admission rules ---------------------------------------
    def test_drafts_change_no_output(self, component, seed):
        """A fake proposer drafting 3 tokens a step, of which verification accepts 0 to 3: over a
        tiny KV cache (preemption), with and without prefix caching, chunked or not, every request
        produces exactly the tokens it produces one token per step, stops and ``max_tokens``
        falling inside drafts included. The driver checks each step: drafts within the budget and
        ``max_model_len``, accepted tokens appended up to the first stop, rejected drafts' slots
        given back, no leaks; and, with aborts, the same invariants."""
        workload = random_workload(seed, aborts=0)
        plain, _ = self.run_workload(component, workload)
        drafted, _ = self.run_workload(component, workload, proposer=draft_proposer(workload.vocab, seed))
        assert drafted.outputs == plain.outputs, "verifying drafts changed the output"
        assert drafted.drafts_accepted and drafted.drafts_accepted < drafted.drafts_verified, (
            f"{drafted.drafts_accepted} of {drafted.drafts_verified} drafts accepted: expected some, not all"
        )
        assert drafted.steps < plain.steps, f"{drafted.steps} steps with drafts, {plain.steps} without"
        self.run_workload(component, random_workload(seed), proposer=draft_proposer(workload.vocab, seed + 1))

    def test_drafts_never_exceed_the_budget(self, component):
        """Four decoding requests drafting 3 tokens each under a budget of 8 tokens: steps verify the
        drafts that fit (never over 8 tokens, the driver checks) and drop the others."""
        workload = random_workload(0, tiny_cache=False, aborts=0).with_(max_num_batched_tokens=8, max_num_seqs=4)
        params = SamplingParams(max_tokens=12, ignore_eos=True)
        arrivals = [Arrival(0, f"r{i}", [3 + i] * 2, params) for i in range(4)]
        # Always-right drafts: only the budget limits them.
        result, _ = self.run_workload(
            component, workload.with_(arrivals=arrivals), proposer=draft_proposer(workload.vocab, 0, always_right=True)
        )
        assert 0 < result.drafts_verified < 4 * 11 * 3, f"{result.drafts_verified} drafts verified"
        assert result.drafts_accepted == result.drafts_verified
        assert all(len(tokens) == 12 for tokens in result.outputs.values())

    def test_request_held_until_ready_does_not_block_others(self, component):
        """A request not ready (``Request.ready_when``: a grammar compiling) is not admitted until it
        is, while requests that arrived after it are; once ready it runs to its end."""
        workload = random_workload(0, tiny_cache=False, aborts=0).with_(max_num_seqs=4)
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        arrivals = [Arrival(0, "held", [3] * 5, params, priority=0, ready_at=6)]
        arrivals += [Arrival(0, f"r{i}", [4 + i] * 5, params, priority=1) for i in range(3)]
        result, _ = self.run_workload(component, workload.with_(arrivals=arrivals))  # checks no early admission
        assert result.admissions[:3] == ["r0", "r1", "r2"] and result.admissions[3] == "held", result.admissions
        assert result.outputs["held"] and len(result.outputs["held"]) == 3

    def test_admission_rule_caps_distinct_keys_per_step(self, component):
        """With :class:`~kvserve.scheduling.DistinctKeyLimit` (here on ``priority``, as it would be on a
        LoRA adapter id) at 2, no step's running requests, hence no step's batch, hold more than 2
        distinct keys; requests of a third key wait and run later, every request finishes."""
        workload = random_workload(2, tiny_cache=False, aborts=0).with_(max_num_seqs=8, max_num_batched_tokens=64)
        params = SamplingParams(max_tokens=4, ignore_eos=True)
        arrivals = [Arrival(0, f"r{i}", [3 + i] * 4, params, priority=i % 4) for i in range(12)]
        scheduler = self.make_scheduler(component, workload)
        scheduler.add_admission_rule(DistinctKeyLimit(lambda request: request.priority, 2))
        driver = SchedulerDriver(scheduler, vocab=workload.vocab)
        for arrival in arrivals:
            driver.add(arrival)
        seen = set()
        with reported_as(f"scheduler {self.scheduler!r}"):
            while scheduler.has_unfinished():
                plan = driver.step()
                keys = {r.priority for r in driver.running} | {item.request.priority for item in plan.scheduled}
                assert len(keys) <= 2, f"step {driver.step_index}: running requests hold keys {sorted(keys)}"
                seen |= keys
        assert seen == {0, 1, 2, 3} and len(driver.result.outputs) == 12, (seen, sorted(driver.result.outputs))


def _long_arrival(i: int, seed: int) -> Arrival:
    """Requests that all arrive at once and grow long: more KV than a tiny cache holds."""
    prompt = [3 + (i * 7 + seed + j) % 29 for j in range(10 + (i * 5 + seed) % 11)]
    return Arrival(0, f"p{i}", prompt, SamplingParams(max_tokens=16 + i % 3, ignore_eos=True), priority=i % 3)
