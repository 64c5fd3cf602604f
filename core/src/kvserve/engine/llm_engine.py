"""The synchronous engine: requests in, one batched step at a time, outputs back."""

from __future__ import annotations

import functools
import logging
import time
from contextlib import suppress
from typing import Any

import torch

from kvserve import components
from kvserve.config import EngineConfig, SchedulerConfig
from kvserve.engine.generation_defaults import (
    default_sampling_fields,
    describe_defaults,
    generation_config_folder,
    read_generation_config,
)
from kvserve.engine.output_processor import RequestState
from kvserve.engine.stats import EngineStats, LoRAStats, StatLogger
from kvserve.engine.validation import CheckedRequest, check_request
from kvserve.errors import EngineDeadError
from kvserve.executor import Executor, InProcessExecutor
from kvserve.interfaces import SchedulerOutput
from kvserve.interfaces.proposer import TargetModel
from kvserve.logging_setup import configure_logging
from kvserve.lora.layers import LORA_SLOT
from kvserve.lora.manager import LoRAManager, adapter_id
from kvserve.lora.request import LoRARequest
from kvserve.lora.tokenizer import AdapterTokenizers
from kvserve.outputs import RequestOutput, TokenLogprobs
from kvserve.reasoning import load_reasoning_parser
from kvserve.request import Request, RequestStatus
from kvserve.runner.build import build_runner
from kvserve.runner.model_settings import ModelSettings
from kvserve.runner.step_input import StepInput, TokenMetadataSource
from kvserve.runner.step_logits import StepLogits
from kvserve.sampling import Sampler, SamplerOutput, default_stages, token_logprobs
from kvserve.sampling.batch_processors import BatchLogitsProcessorsStage
from kvserve.sampling.processor_loading import resolve_logits_processors
from kvserve.sampling_params import SamplingParams
from kvserve.scheduling import DistinctKeyLimit
from kvserve.spec_decode.speculator import Speculator, load_proposer
from kvserve.spec_decode.verification import accepted_tokens, row_requests
from kvserve.stopping import grammar_complete
from kvserve.structured_outputs.compiler import GrammarCompiler

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
        self.default_sampling_fields = default_sampling_fields(config.model, source.path)
        """SamplingParams fields a request that leaves them unset gets (the model's generation config,
        ``override_generation_config`` over it); the front ends apply them (``LLM``, the server)."""

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
        spec = config.decoding.speculative_config
        target = TargetModel(config, self.platform, str(source.path), self.max_model_len)
        self.speculator = Speculator(spec, load_proposer(config, self.hf_config.vocab_size, target)) if spec else None
        """Speculative decoding's drafts and counters; None when it is off."""
        self.grammars = GrammarCompiler(
            self.tokenizer, self.hf_config.vocab_size, self.eos_token_ids, config.decoding.structured_outputs_config,
            load_reasoning_parser(config.server.reasoning_parser, self.tokenizer),  # grammars wait for the answer
        )  # fmt: skip
        self.token_metadata: dict[str, TokenMetadataSource] = {}
        """Name -> the value each token of a request carries under it, sent to the model with every
        step (:attr:`kvserve.forward_context.ForwardContext.token_metadata`), e.g. LoRA adapter ids."""
        self.lora = self._lora_manager() if config.lora.enable_lora else None
        """The LoRA adapters' cache and slots; None when ``enable_lora`` is off."""
        self.tokenizers = AdapterTokenizers(self.tokenizer, enabled=self.lora is not None)
        """Each request's tokenizer: its adapter's own where the adapter ships one, else the model's."""
        self.states: dict[str, RequestState] = {}
        """Requests by id, until their final output is out."""
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
        logger.info(describe_defaults(self.default_sampling_fields, config.model, source.path))

    def execution_summary(self) -> str:
        """How steps run: optimization level, eager or compiled (with compile seconds so far), the
        attention backend and the kernels it runs, e.g. ``optimization_level=0 (eager)
        attention_backend=cpu (decode and prefill: C++ paged kernel ...) linear_kernel=avx512 (...)
        layer_ops=cpu-native (...) sampling_kernel=cpu-native``, and ``lora_kernel=torch`` with LoRA on."""
        level = self.config.compilation.optimization_level
        compiled = self.runner.compiled if self.runner is not None else None
        how = compiled.describe() if compiled is not None else "eager" if level == 0 else "compiled on every rank"
        kernels = self.runner.backend.kernels() if self.runner is not None else ""
        backend = f"{self.backend_name} ({kernels})" if kernels else self.backend_name
        info = self.executor.info
        lora = "" if info.lora_kernel is None else f" lora_kernel={info.lora_kernel}"
        return (
            f"optimization_level={level} ({how}) attention_backend={backend} linear_kernel={info.linear_kernel} "
            f"layer_ops={info.layer_ops} sampling_kernel={self.sampler.kernel.describe()}{lora}"
        )

    # -- construction -------------------------------------------------------------------
    def _distributed_executor(self) -> Executor:
        if self.config.parallel.distributed_executor_backend == "ray":
            from kvserve.executor.ray_executor import RayExecutor

            return RayExecutor(self.config, self.platform)
        from kvserve.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(self.config, self.platform.distributed_backend)

    def _lora_manager(self) -> LoRAManager:
        """The host's adapter cache and slot assignment (every rank's runner holds the slots: it
        loads what each step carries), the per-token slot in every step and at most ``max_loras``
        distinct adapters running."""
        lora = self.config.lora
        targets = self.executor.info.lora_targets
        manager = LoRAManager(targets, lora.max_loras, lora.max_lora_rank, lora.cached_adapters())
        self.token_metadata[LORA_SLOT] = manager.slot_of
        self.scheduler.add_admission_rule(DistinctKeyLimit(adapter_id, lora.max_loras))
        return manager

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
        """EOS ids as HF ``generate`` sees them: generation_config.json (the ``generation_config``
        folder's when one is named, as vLLM), else config, else tokenizer."""
        eos = getattr(self.hf_config, "eos_token_id", None)
        folder = generation_config_folder(self.config.model, source.path)
        eos = read_generation_config(folder).get("eos_token_id") or eos
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return (eos,) if isinstance(eos, int) else tuple(eos or ())

    # -- requests -------------------------------------------------------------------------
    def check_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> CheckedRequest:
        """The request checked for :meth:`add_request`, for a front end in this process (see
        :func:`~kvserve.engine.validation.check_request`): raises naming the field a ValueError for
        a token id outside the vocabulary (prompt, ``stop_token_ids``, ``allowed_token_ids``,
        ``logit_bias``, tokenized ``bad_words``), ``n`` above ``max_n``, params a batch-level logits
        processor refuses or a ``lora_request`` without ``enable_lora``, a CapacityError for too long a
        request, EngineDeadError once the engine has stopped. Nothing decodes the prompt."""
        self._check_alive()
        return check_request(
            prompt_token_ids, params, vocab_size=self.hf_config.vocab_size, max_model_len=self.max_model_len,
            max_n=self.config.scheduler.max_n,
            tokenizer=self.tokenizers.of(lora_request),
            logits_processors=self.logits_processor_classes,
            structured_outputs=self.config.decoding.structured_outputs_config,
            prompt=prompt, priority=priority, cache_salt=cache_salt, lora_request=lora_request,
            enable_lora=self.lora is not None,
        )  # fmt: skip

    def load_lora(self, lora_request: LoRARequest) -> None:
        """Read and check ``lora_request``'s adapter now (cached for the requests that name it):
        ValueError naming the problem; see :meth:`~kvserve.lora.manager.LoRAManager.load`."""
        if self.lora is None:
            raise ValueError("lora_request: this engine was started without LoRA; start it with enable_lora=True")
        self.lora.load(lora_request)

    def remove_lora(self, lora_int_id: int) -> None:
        """Unload adapter ``lora_int_id``: requests already running with it finish with it; its host copy
        and slot are freed after the last one (:meth:`~kvserve.lora.manager.LoRAManager.remove`)."""
        if self.lora is not None:
            self.lora.remove(lora_int_id)
        self.tokenizers.forget(lora_int_id)

    def add_request(self, request_id: str, request: CheckedRequest) -> None:
        """Queue a request a front end checked (it is not checked again). ValueError if
        ``request_id`` is in use or the request asks for more than one sample (a front end fans
        ``n > 1`` out: :class:`~kvserve.frontend.parallel_sampling.ParentRequest`) or its LoRA adapter
        cannot be loaded (:meth:`load_lora`); EngineDeadError once the engine has stopped."""
        self._check_alive()
        if request_id in self.states:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        if request.params.n != 1:
            raise ValueError(f"n: the engine runs one sample per request (got {request.params.n}); fan it out first")
        if request.lora_request is not None:
            self.load_lora(request.lora_request)
        tokenizer = self.tokenizers.of(request.lora_request)
        queued = Request(
            request_id,
            list(request.prompt_token_ids),
            request.params,
            self.eos_token_ids,
            priority=request.priority,
            cache_salt=request.cache_salt,
            bad_words_token_ids=request.bad_words_token_ids,
            lora_request=request.lora_request,
        )
        if request.after_prompt_of is not None:
            queued.ready_when = functools.partial(self._prompt_shared, request.after_prompt_of, queued)
        if request.structured_output_backend is not None:
            self.grammars.submit(queued, request.structured_output_backend)
        self.states[request_id] = RequestState(request_id, request.prompt, queued, tokenizer)
        if self.lora is not None and request.lora_request is not None:
            self.lora.acquire(request_id, request.lora_request)
        self.scheduler.add_request(queued)

    def _prompt_shared(self, leader_id: str, request: Request) -> bool:
        """Whether ``request`` (a later sample of an ``n > 1`` request) may be admitted: the prefix
        cache holds every full block of the prompt of ``leader_id`` (computed, or being computed
        in this step: ``request`` then starts beside it), the leader's prompt is computed, or
        the leader is gone."""
        state = self.states.get(leader_id)
        if state is None or state.request.num_computed_tokens >= state.request.num_prompt_tokens:
            return True
        block_size = self.kv_cache_manager.block_size
        shareable = (request.num_prompt_tokens - 1) // block_size * block_size  # the last token is recomputed
        return self.kv_cache_manager.num_cached_tokens(request) >= shareable

    def abort_request(self, request_id: str) -> None:
        """Stop a request now and free all its KV blocks (unknown ids are ignored)."""
        state = self.states.pop(request_id, None)
        if state is not None:
            self.scheduler.abort_request(request_id)
            self._release(state.request)

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
            failed = self._install_grammars()
            plan = self.scheduler.schedule()
            if not plan.scheduled:
                self.stat_logger.record_step(0, 0, len(plan.preempted))
                return self._outputs(failed)
            self._mark_scheduled(plan)
            loads = () if self.lora is None else tuple(self.lora.activate(item.request for item in plan.scheduled))
            keep_hidden = self.speculator is not None and self.speculator.uses_hidden_states
            step = self.executor.execute(
                StepInput.from_plan(
                    plan, self.kv_cache_manager, self.token_metadata, keep_hidden_states=keep_hidden, lora_loads=loads
                )
            )
            # Who samples: the requests whose chunk completes their sequence, from each of its rows (one,
            # or 1 + k verifying k drafts: every row is sampled as the request with the drafts before it).
            rows: list[Request] = []
            for i in step.sampled_chunks:
                item = plan.scheduled[i]
                drafts = item.draft_token_ids
                rows += row_requests(item.request, drafts, step.logits.shape[1]) if drafts else [item.request]
            sampled = self.sampler(step.logits, rows, logits_owned=True)
            updated, num_new_tokens = self._update(plan, step, sampled)
            seconds = time.perf_counter() - started
            self.scheduler.record_step_time(plan, seconds)
            if self.speculator is not None:
                self.speculator.record_step(sum(item.num_tokens for item in plan.scheduled), seconds)
            self._record_step(plan, num_new_tokens)
            changed = failed | updated
            return self._outputs(changed)
        except Exception as exc:
            self._die(exc)
            raise EngineDeadError(f"the engine stopped: its step failed with {type(exc).__name__}: {exc}") from exc

    def _install_grammars(self) -> dict[str, RequestState]:
        """Give waiting requests their compiled grammars; fail those whose grammar failed to compile."""
        failed = {}
        for request_id, error in self.grammars.install_ready().items():
            state = self.states.get(request_id)
            if state is not None:
                self._fail(state, error, invalid_request=True)  # the request's own constraint
                failed[request_id] = state
        return failed

    def _mark_scheduled(self, plan: SchedulerOutput) -> None:
        now = time.monotonic()
        for item in plan.scheduled:
            state = self.states[item.request.request_id]
            if state.metrics.first_scheduled_time is None:
                state.metrics.first_scheduled_time = now

    def _live_state(self, request: Request) -> RequestState | None:
        """``request``'s state, or None once it has finished (failed earlier in this step)."""
        state = self.states.get(request.request_id)
        return None if state is None or state.finished else state

    def _update(
        self, plan: SchedulerOutput, step: StepLogits, sampled: SamplerOutput
    ) -> tuple[dict[str, RequestState], int]:
        """Book the sampled tokens: verify drafts, fail requests whose emitted rows failed, then the
        scheduler, then the outputs token by token. Returns the requests that changed and the number
        of tokens they emitted."""
        changed: dict[str, RequestState] = {}
        failing: dict[str, tuple[Request, str, bool]] = {}  # request id -> (request, its error, invalid)
        accepted: dict[int, list[int]] = {}  # chunk -> its new tokens
        owners: list[tuple[Request, int, int]] = []  # (request, its first row, its output length before)
        for i in step.sampled_chunks:
            item, rows = plan.scheduled[i], step.rows(i)
            tokens = sampled.tokens[rows.start : rows.stop]
            accepted[i] = accepted_tokens(item.draft_token_ids, tokens) if item.num_lookahead else tokens
            if item.num_lookahead and self.speculator is not None:
                self.speculator.record_verification(item.request.request_id, item.num_lookahead, len(accepted[i]) - 1)
            owners.append((item.request, rows.start, len(item.request.output_token_ids)))
            # Rows past the emitted tokens verified drafts that were rejected: their failures do not count.
            for row in range(rows.start, rows.start + len(accepted[i])):
                if row in sampled.errors:
                    failing.setdefault(
                        item.request.request_id, (item.request, sampled.errors[row], row in sampled.invalid_rows)
                    )
        if failing:
            for item in plan.scheduled:
                # The forward ran: a failing request's chunk holds its KV, which a request admitted in
                # this step may already share (a common prefix). Counted as computed, its blocks are
                # freed as cached ones, not as blocks of a step that never ran.
                if item.request.request_id in failing:
                    item.request.num_computed_tokens += item.num_tokens
        for request, error, invalid in failing.values():
            state = self._live_state(request)
            if state is not None:
                self._fail(state, error, invalid_request=invalid)
                changed[state.request_id] = state
        self._record_prompt_logprobs(plan, step)
        self.scheduler.update(plan, [accepted.get(i, []) for i in range(len(plan.scheduled))])
        num_new_tokens = 0
        hidden: dict[str, torch.Tensor] = {}  # request id -> hidden states of its emitted tokens' rows
        for request, first_row, before in owners:
            state = self._live_state(request)
            if state is None:
                continue  # it failed above
            changed[state.request_id] = state
            new_tokens = request.output_token_ids[before:]  # the accepted ones, up to a token stop rule
            num_new_tokens += len(new_tokens)
            if step.hidden_states is not None:
                hidden[request.request_id] = step.hidden_states[first_row : first_row + len(new_tokens)]
            try:
                self.sampler.accept(request, new_tokens)
            except Exception as exc:  # its constraint refused a token: this request only
                self._fail(state, f"accepting the tokens failed: {type(exc).__name__}: {exc}")
                continue
            try:
                for n, token in enumerate(new_tokens):
                    logprobs = sampled.logprobs[first_row + n] if sampled.logprobs else None
                    if self._add_token(state, token, logprobs, last=n == len(new_tokens) - 1):
                        del request.output_token_ids[before + n + 1 :]  # nothing past a stop string
                        break
            except Exception as exc:  # e.g. a token its tokenizer cannot decode: this request only
                self._fail(state, f"processing the output failed: {type(exc).__name__}: {exc}")
        if self.speculator is not None:
            running = [r for r, _, _ in owners if not r.status.finished]
            self.speculator.propose(running, self.scheduler.num_running(), hidden)
        return changed, num_new_tokens

    def _add_token(self, state: RequestState, token: int, logprobs: TokenLogprobs | None, last: bool) -> bool:
        """Detokenize one of the request's new tokens and apply its stop string, its finished grammar
        (after the ``last`` new token: the grammar has accepted them all) or the scheduler's stop (the
        rules: :mod:`kvserve.stopping`). True when the request finished at this token."""
        request, seq = state.request, state.sequence
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = time.monotonic()
        stop = seq.add_token(token, logprobs)
        if stop is not None or (last and grammar_complete(request)):
            if not request.status.finished:
                self.scheduler.abort_request(request.request_id)  # frees its blocks
            request.status = RequestStatus.FINISHED_STOPPED
            seq.finish("stop", stop)
        elif last and request.status.finished:
            seq.finish(request.status.finish_reason, request.stop_reason)
        if seq.finish_reason is None:
            return False
        self._release(request)
        return True

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
    def _fail(self, state: RequestState, error: str, invalid_request: bool = False) -> None:
        """Finish ``state`` with ``"abort"`` and ``error``, freeing its blocks; ``invalid_request``: its
        own parameters caused it (a client error)."""
        logger.warning("request %s failed: %s", state.request_id, error)
        state.error = error
        state.invalid_request = invalid_request
        self.scheduler.abort_request(state.request_id)
        state.request.status = RequestStatus.FINISHED_ABORTED
        if state.sequence.finish_reason is None:
            state.sequence.finish("abort")
        self._release(state.request)

    def _die(self, exc: Exception) -> None:
        """The batch failed: stop for good, dropping (and freeing) every request."""
        logger.error("engine step failed; the engine stops", exc_info=exc)
        self.dead_error = exc
        for request_id in list(self.states):
            with suppress(Exception):  # the scheduler may be what broke; nothing more can be done
                self.abort_request(request_id)
        self.states.clear()
        self.executor.shutdown()

    def shutdown(self) -> None:
        """Stop the executor's workers (tensor parallelism) and the grammar compiler; the engine
        cannot step afterwards."""
        self.grammars.shutdown()
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
            spec_decode=None if self.speculator is None else self.speculator.stats.copy(),
            lora=None if self.lora is None else self._lora_stats(),
        )

    def _lora_stats(self) -> LoRAStats:
        running, waiting = set(), set()
        for state in list(self.states.values()):  # list(): the server thread may read while the engine steps
            lora_request = state.request.lora_request
            if lora_request is not None:
                is_running = state.request.status == RequestStatus.RUNNING
                (running if is_running else waiting).add(lora_request.lora_name)
        return LoRAStats(tuple(sorted(running)), tuple(sorted(waiting)), self.config.lora.max_loras)

    @property
    def num_preemptions(self) -> int:
        return self.stat_logger.preemptions_total

    # -- bookkeeping ----------------------------------------------------------------------
    def _record_prompt_logprobs(self, plan: SchedulerOutput, step: StepLogits) -> None:
        """Logprobs of the prompt positions this step computed for the first time (a preempted
        request computes them again: they are not re-added)."""
        for index, logits in step.prompt_logits.items():
            item = plan.scheduled[index]
            state = self._live_state(item.request)
            if state is None:
                continue  # failed in this step
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
        """``request`` has finished: drop what the sampler keeps for it (its state stays until its
        final output is out)."""
        self.sampler.forget(request.request_id)
        self.grammars.forget(request.request_id)
        if self.lora is not None:
            self.lora.release(request.request_id)
        if self.speculator is not None:
            self.speculator.forget(request.request_id)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached KV block (e.g. after the weights changed); False, changing nothing,
        while requests still hold blocks."""
        return self.kv_cache_manager.reset_prefix_cache()


def _scheduler_summary(name: str, config: SchedulerConfig) -> str:
    """The scheduler for the start-up line, with the time-aware prefill limit when it is on."""
    slowdown = config.decode_slowdown()
    return f"{name} (max_decode_slowdown={slowdown:g})" if slowdown else name
