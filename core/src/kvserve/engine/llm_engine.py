"""The synchronous engine: requests in, one batched step at a time, outputs back."""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from kvserve import components
from kvserve.config import EngineConfig, SchedulerConfig
from kvserve.engine.output_processor import RequestState, SequenceState
from kvserve.engine.stats import EngineStats, StatLogger
from kvserve.engine.validation import check_request
from kvserve.errors import EngineDeadError
from kvserve.executor import Executor, InProcessExecutor
from kvserve.interfaces import SchedulerOutput
from kvserve.logging_setup import configure_logging
from kvserve.outputs import RequestOutput, TokenLogprobs
from kvserve.request import Request, RequestStatus
from kvserve.runner.build import build_runner
from kvserve.runner.model_settings import ModelSettings
from kvserve.runner.step_input import StepInput, TokenMetadataSource
from kvserve.runner.step_logits import StepLogits
from kvserve.sampling import Sampler, SamplerOutput, default_stages, token_logprobs
from kvserve.sampling.batch_processors import BatchLogitsProcessorsStage
from kvserve.sampling.processor_loading import resolve_logits_processors
from kvserve.sampling_params import SamplingParams

logger = logging.getLogger("kvserve")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        from kvserve.loader import open_model

        configure_logging()
        self.config = config
        self.platform = components.resolve_platform(config)
        source = open_model(config.model.model, config.model.tokenizer)
        self.tokenizer = source.tokenizer
        self.model_path = source.path
        self.hf_config = source.hf_config
        settings = ModelSettings.resolve(config, self.platform, self.hf_config)
        self.dtype, self.max_model_len = settings.dtype, settings.max_model_len
        self.platform.seed_everything(config.model.seed)
        self.eos_token_ids = self._eos_token_ids(source)

        scheduler_cls, manager_cls = components.resolve_policy_components(config)
        if config.parallel.tensor_parallel_size > 1:
            # The driver: workers hold the model shards and their KV caches; it plans and samples.
            self.model = self.runner = None
            self.executor = self._distributed_executor()
        else:
            self.runner = build_runner(config, self.platform, source, settings)
            self.model = self.runner.model
            self.executor = InProcessExecutor(self.runner)
        info = self.executor.info
        self.num_kv_blocks = info.num_kv_blocks
        """KV blocks of the cache, the null block included."""
        self.kv_cache_manager = manager_cls(info.num_kv_blocks, info.block_size, config.cache.enable_prefix_caching)
        self.scheduler = scheduler_cls(config.scheduler, self.kv_cache_manager, self.max_model_len)
        self.sampler = self._sampler()
        self.token_metadata: dict[str, TokenMetadataSource] = {}
        """Name -> the value each token of a request carries under it, sent to the model with every
        step (:attr:`kvserve.forward_context.ForwardContext.token_metadata`), e.g. LoRA adapter ids."""
        self.states: dict[str, RequestState] = {}
        """User requests by id."""
        self.sequences: dict[str, tuple[RequestState, SequenceState]] = {}
        """Scheduler-level requests (one per completion) by id."""
        self.stat_logger = StatLogger()
        self.dead_error: Exception | None = None
        """What stopped the engine (a failed step); None while it runs."""
        tp = config.parallel.tensor_parallel_size
        self.backend_name = info.attention_backend + (f" x{tp} ranks" if tp > 1 else "")
        logger.info(
            "kvserve engine: model=%s platform=%s dtype=%s (%s) %s scheduler=%s "
            "kv_cache_manager=%s block_size=%d num_kv_blocks=%d (%d tokens) max_model_len=%d",
            source.path, self.platform.name, str(self.dtype).removeprefix("torch."),
            components.dtype_reason(config, self.platform), self.execution_summary(),
            _scheduler_summary(scheduler_cls.name, config.scheduler), manager_cls.name, info.block_size,
            info.num_kv_blocks - 1, (info.num_kv_blocks - 1) * info.block_size, self.max_model_len,
        )  # fmt: skip

    def execution_summary(self) -> str:
        """How steps run: optimization level, eager or compiled (with compile seconds so far), the
        attention backend and the kernels it runs, e.g. ``optimization_level=0 (eager)
        attention_backend=cpu (decode and prefill: C++ paged kernel ...) linear_kernel=avx512 (...)
        layer_ops=cpu-native (...) sampling_kernel=cpu-native``."""
        level = self.config.compilation.optimization_level
        compiled = self.runner.compiled if self.runner is not None else None
        how = compiled.describe() if compiled is not None else "eager" if level == 0 else "compiled on every rank"
        kernels = self.runner.backend.kernels() if self.runner is not None else ""
        backend = f"{self.backend_name} ({kernels})" if kernels else self.backend_name
        info = self.executor.info
        return (
            f"optimization_level={level} ({how}) attention_backend={backend} linear_kernel={info.linear_kernel} "
            f"layer_ops={info.layer_ops} sampling_kernel={self.sampler.kernel.describe()}"
        )

    # -- construction -------------------------------------------------------------------
    def _distributed_executor(self) -> Executor:
        if self.config.parallel.distributed_executor_backend == "ray":
            from kvserve.executor.ray_executor import RayExecutor

            return RayExecutor(self.config, self.platform)
        from kvserve.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(self.config, self.platform.distributed_backend)

    def _sampler(self) -> Sampler:
        """The sampler pipeline, with the configured batch-level logits processors as one stage; it
        runs on the driver (under tensor parallelism too), where rank 0's logits arrive."""
        self.logits_processor_classes = resolve_logits_processors(self.config.model.logits_processors)
        device = self.platform.device() if self.model is not None else torch.device("cpu")
        processors = [cls(self.config, device, False) for cls in self.logits_processor_classes]
        extra = [BatchLogitsProcessorsStage(processors)] if processors else []
        kernel = self.platform.sampling_kernel() if self.model is not None else None
        return Sampler(self.config.model.seed, default_stages(extra), self.config.model.logprobs_mode, kernel)

    def _eos_token_ids(self, source: Any) -> tuple[int, ...]:
        """EOS ids as HF ``generate`` sees them: generation_config.json, else config, else tokenizer."""
        eos = getattr(self.hf_config, "eos_token_id", None)
        if (Path(source.path) / "generation_config.json").is_file():
            eos = GenerationConfig.from_pretrained(source.path).eos_token_id or eos
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return (eos,) if isinstance(eos, int) else tuple(eos or ())

    # -- requests -------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        prompt: str | None = None,
        cache_salt: str | None = None,
    ) -> None:
        """Queue a request; raises (naming the field) if it can never run, leaving the engine untouched.

        ``cache_salt`` keeps the request's prefix-cache entries apart from other tenants'.
        """
        if request_id in self.states:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        bad_words = self._check_request(prompt_token_ids, params)
        # n > 1: the leader prefills the prompt; followers join when it is done (see _fork).
        sequences = [
            Request(
                request_id if i == 0 else f"{request_id}#{i}",
                list(prompt_token_ids),
                params if params.n == 1 else _follower_params(params, i),
                self.eos_token_ids,
                priority=priority,
                cache_salt=cache_salt,
                bad_words_token_ids=bad_words,
            )
            for i in range(params.n)
        ]
        state = RequestState(request_id, prompt, sequences, self.tokenizer, params)
        self.states[request_id] = state
        for seq in state.sequences:
            self.sequences[seq.request.request_id] = (state, seq)
        self.scheduler.add_request(sequences[0])

    def validate_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise naming the field if this request can never be served: a ValueError for a token id
        outside the vocabulary (prompt, ``stop_token_ids``, ``allowed_token_ids``, ``logit_bias``,
        tokenized ``bad_words``) or ``n`` above ``max_n``, a CapacityError for
        too long a request, EngineDeadError once the engine has stopped. Nothing decodes the prompt."""
        self._check_request(prompt_token_ids, params)

    def _check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> list[list[int]]:
        """:meth:`validate_prompt`; returns the bad words as token ids."""
        self._check_alive()
        return check_request(
            prompt_token_ids,
            params,
            vocab_size=self.hf_config.vocab_size,
            max_model_len=self.max_model_len,
            max_n=self.config.scheduler.max_n,
            tokenizer=self.tokenizer,
            logits_processors=self.logits_processor_classes,
        )

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free all its KV blocks (unknown ids are ignored)."""
        state = self.states.pop(request_id, None)
        if state is None:
            return
        for seq in state.sequences:
            self.scheduler.abort_request(seq.request.request_id)
            self._release(seq.request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.states)

    # -- the step ---------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one batched step: schedule -> execute -> sample -> update -> outputs, of the requests
        that changed, per their ``output_kind``.

        A failure that belongs to one request (its logits processor, its detokenization, ...)
        finishes that request with ``finish_reason="abort"`` and ``RequestOutput.error`` and frees
        its blocks; the others go on. A failure of the batch itself (the forward pass) stops the
        engine: every request is dropped and this and every later call raise EngineDeadError.
        """
        self._check_alive()
        try:
            started = time.perf_counter()
            plan = self.scheduler.schedule()
            if not plan.scheduled:
                self.stat_logger.record_step(0, 0, len(plan.preempted))
                return []
            self._mark_scheduled(plan)
            step = self.executor.execute(StepInput.from_plan(plan, self.kv_cache_manager, self.token_metadata))
            owners, rows = self._sampling_rows(plan, step)
            # Rows in order (no followers): a view, not a copy of [rows, vocab] logits per step.
            logits = step.logits[: len(rows)] if rows == list(range(len(rows))) else step.logits[rows]
            sampled = self.sampler(logits, owners)
            changed = self._update(plan, step, owners, sampled)
            self.scheduler.record_step_time(plan, time.perf_counter() - started)
            self._record_step(plan, len(owners))
            return self._outputs(changed)
        except Exception as exc:
            self._die(exc)
            raise EngineDeadError(f"the engine stopped: its step failed with {type(exc).__name__}: {exc}") from exc

    def _mark_scheduled(self, plan: SchedulerOutput) -> None:
        now = time.monotonic()
        for item in plan.scheduled:
            state, _ = self.sequences[item.request.request_id]
            if state.metrics.first_scheduled_time is None:
                state.metrics.first_scheduled_time = now

    def _sampling_rows(self, plan: SchedulerOutput, step: StepLogits) -> tuple[list[Request], list[int]]:
        """Who samples a token now, and from which logits row: the requests whose chunk completes
        their sequence (its last position's row), then the followers of a leader that just
        finished its prompt (its row)."""
        chunks = step.sampled_chunks
        completing = [plan.scheduled[i].request for i in chunks]
        owners, rows = list(completing), [step.rows(i)[-1] for i in chunks]
        for row, request in zip(list(rows), completing):
            for follower in self._followers_ready(request):
                owners.append(follower)
                rows.append(row)
        return owners, rows

    def _update(
        self, plan: SchedulerOutput, step: StepLogits, owners: list[Request], sampled: SamplerOutput
    ) -> dict[str, RequestState]:
        """Book the sampled tokens: failed requests first, then forks, the scheduler, the outputs."""
        changed: dict[str, RequestState] = {}
        failing: dict[str, tuple[RequestState, str]] = {}  # state id -> (state, its first sequence's error)
        for row, error in sampled.errors.items():
            entry = self.sequences.get(owners[row].request_id)
            if entry is not None:
                failing.setdefault(entry[0].request_id, (entry[0], error))
        if failing:
            for item in plan.scheduled:
                # The forward ran: a failing request's chunk holds its KV, which a request admitted in
                # this step may already share (a common prefix). Counted as computed, its blocks are
                # freed as cached ones, not as blocks of a step that never ran.
                entry = self.sequences.get(item.request.request_id)
                if entry is not None and entry[0].request_id in failing:
                    item.request.num_computed_tokens += item.num_tokens
        for state, error in failing.values():
            self._fail(state, error)
            changed[state.request_id] = state
        self._record_prompt_logprobs(plan, step)
        tokens = dict(zip(map(id, owners), sampled.tokens))
        logprobs = dict(zip(map(id, owners), sampled.logprobs or [None] * len(owners)))
        # Followers fork before the update, which could free a leader that finishes right away.
        for follower in owners[len(step.sampled_chunks) :]:
            if follower.request_id in self.sequences:
                self._fork(follower, tokens[id(follower)])
        self.scheduler.update(
            plan, [[tokens[id(item.request)]] if id(item.request) in tokens else [] for item in plan.scheduled]
        )
        for request in owners:
            entry = self.sequences.get(request.request_id)
            if entry is None:
                continue  # its request failed above
            state, seq = entry
            changed[state.request_id] = state
            try:
                self.sampler.accept(request, request.output_token_ids[-1:])
            except Exception as exc:  # its constraint refused the token: this request only
                self._fail(state, f"accepting the token failed: {type(exc).__name__}: {exc}")
                continue
            try:
                self._add_token(state, seq, logprobs[id(request)])
            except Exception as exc:  # e.g. a token its tokenizer cannot decode: this request only
                self._fail(state, f"processing the output failed: {type(exc).__name__}: {exc}")
        return changed

    def _add_token(self, state: RequestState, seq: SequenceState, logprobs: TokenLogprobs | None) -> None:
        """Detokenize the sequence's new token and apply its stop string or the scheduler's stop."""
        request = seq.request
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = time.monotonic()
        stop = seq.add_token(request.output_token_ids[-1], logprobs)
        constraint = request.logits_constraint
        # A complete grammar stops the request as a stop string does (a token rule that also held wins).
        grammar_done = constraint is not None and not request.status.finished and constraint.is_terminated()
        if stop is not None or grammar_done:
            if not request.status.finished:
                self.scheduler.abort_request(request.request_id)  # frees its blocks
            request.status = RequestStatus.FINISHED_STOPPED
            seq.finish("stop", stop)
        elif request.status.finished:
            seq.finish(request.status.finish_reason, request.stop_reason)
        if seq.finish_reason is not None:
            self._release(request)

    def _outputs(self, changed: dict[str, RequestState]) -> list[RequestOutput]:
        outputs = []
        for state in changed.values():
            output = state.output()
            if output is not None:
                outputs.append(output)
            if state.finished:
                self.states.pop(state.request_id, None)
        return outputs

    def _record_step(self, plan: SchedulerOutput, num_sampled: int) -> None:
        prompt_tokens = sum(i.num_tokens for i in plan.scheduled if i.start < i.request.num_prompt_tokens)
        self.stat_logger.record_step(prompt_tokens, num_sampled, len(plan.preempted))
        self.stat_logger.maybe_log(self.stats)

    # -- failures ---------------------------------------------------------------------------
    def _fail(self, state: RequestState, error: str) -> None:
        """Finish every sequence of ``state`` with ``"abort"`` and ``error``, freeing their blocks."""
        logger.warning("request %s failed: %s", state.request_id, error)
        state.error = error
        for seq in state.sequences:
            self.scheduler.abort_request(seq.request.request_id)
            seq.request.status = RequestStatus.FINISHED_ABORTED
            if seq.finish_reason is None:
                seq.finish("abort")
            self._release(seq.request)

    def _die(self, exc: Exception) -> None:
        """The batch failed: stop for good, dropping (and freeing) every request."""
        logger.error("engine step failed; the engine stops", exc_info=exc)
        self.dead_error = exc
        for request_id in list(self.states):
            with suppress(Exception):  # the scheduler may be what broke; nothing more can be done
                self.abort_request(request_id)
        self.states.clear()
        self.sequences.clear()
        self.executor.shutdown()

    def shutdown(self) -> None:
        """Stop the executor's workers (tensor parallelism); the engine cannot step afterwards."""
        self.executor.shutdown()

    def _check_alive(self) -> None:
        if self.dead_error is not None:
            raise EngineDeadError(f"the engine stopped after its step failed: {self.dead_error!r}")

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=self.scheduler.num_running(),
            num_waiting=self.scheduler.num_waiting(),
            kv_cache=self.kv_cache_manager.stats(),
            prompt_tokens_total=self.stat_logger.prompt_tokens_total,
            generation_tokens_total=self.stat_logger.generation_tokens_total,
            preemptions_total=self.stat_logger.preemptions_total,
        )

    @property
    def num_preemptions(self) -> int:
        return self.stat_logger.preemptions_total

    # -- n > 1 ----------------------------------------------------------------------------
    def _followers_ready(self, leader: Request) -> list[Request]:
        """Followers of ``leader`` whose first token is sampled now: the leader just finished its prompt."""
        state, seq = self.sequences[leader.request_id]
        if seq.index != 0 or leader.output_token_ids or len(state.sequences) == 1:
            return []
        return [s.request for s in state.sequences[1:] if s.request.status is RequestStatus.WAITING]

    def _fork(self, follower: Request, token: int) -> None:
        """Start ``follower`` with its first ``token`` on the leader's prompt KV: full blocks shared,
        the partial one copied. Without a free block for the copy it waits to prefill prompt and
        token on its own, like a preempted request (prefix caching shares the full blocks then)."""
        state, _ = self.sequences[follower.request_id]
        leader = state.sequences[0].request
        follower.append_token(token, self.max_model_len)
        if follower.status.finished:
            return  # it needs no KV at all
        follower.num_computed_tokens = leader.num_prompt_tokens
        pairs = self.kv_cache_manager.fork(leader, follower)
        if pairs is None:
            follower.num_computed_tokens = 0
            self.scheduler.add_request(follower)
            return
        self.executor.copy_blocks(pairs)
        self.scheduler.add_running(follower)

    # -- bookkeeping ----------------------------------------------------------------------
    def _record_prompt_logprobs(self, plan: SchedulerOutput, step: StepLogits) -> None:
        """Logprobs of the prompt positions this step computed for the first time (a preempted
        request, or a follower prefilling on its own, computes them again: they are not re-added)."""
        for index, logits in step.prompt_logits.items():
            item = plan.scheduled[index]
            entry = self.sequences.get(item.request.request_id)
            if entry is None:
                continue  # failed in this step
            state = entry[0]
            first = item.start + 1  # the prompt position the chunk's first row predicts
            skip = len(state.prompt_logprobs) - first  # positions already recorded
            if skip >= len(logits):
                continue
            logits = logits[max(skip, 0) :]
            first += max(skip, 0)
            ids = item.request.prompt_token_ids[first : first + len(logits)]
            targets = torch.tensor(ids, device=logits.device)
            top_n = [state.params.prompt_logprobs] * len(logits)
            state.prompt_logprobs.extend(token_logprobs(logits.log_softmax(dim=-1), targets, top_n))

    def _release(self, request: Request) -> None:
        self.sequences.pop(request.request_id, None)
        self.sampler.forget(request.request_id)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block (e.g. after the weights changed); False, changing nothing,
        while requests still hold blocks."""
        return self.kv_cache_manager.reset_prefix_cache()


def _follower_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sequence ``index`` of an ``n > 1`` request: its own seed (seed + index), as in vLLM."""
    update: dict[str, Any] = {"n": 1}
    if params.seed is not None:
        update["seed"] = params.seed + index
    return params.model_copy(update=update)


def _scheduler_summary(name: str, config: SchedulerConfig) -> str:
    """The scheduler for the start-up line, with the time-aware prefill limit when it is on."""
    slowdown = config.decode_slowdown()
    return f"{name} (max_decode_slowdown={slowdown:g})" if slowdown else name
