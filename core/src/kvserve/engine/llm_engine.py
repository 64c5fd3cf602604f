"""The synchronous engine: requests in, one batched step at a time, outputs back."""

from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from kvserve import distributed
from kvserve.config import AUTO, EngineConfig, SchedulerConfig
from kvserve.engine import components
from kvserve.engine.compilation import CompiledForward
from kvserve.engine.model_runner import ModelRunner, StepLogits
from kvserve.engine.output_processor import RequestState, SequenceState
from kvserve.engine.profiling import profile_peak_memory
from kvserve.engine.sampler import Sampler, SamplerOutput, top_logprobs
from kvserve.engine.stats import EngineStats, StatLogger
from kvserve.engine.validation import check_request
from kvserve.errors import ConfigError, EngineDeadError
from kvserve.executor import Executor, InProcessExecutor
from kvserve.interfaces import AttentionBackend, LayerAttentionSpec, QuantizationMethod, SchedulerOutput
from kvserve.layers import (
    LinearBase,
    TorchLayerOps,
    UnquantizedLinearMethod,
    attention_layers,
    pack_linear_weights,
    use_layer_ops,
)
from kvserve.logging_setup import configure_logging
from kvserve.outputs import RequestOutput, TokenLogprobs
from kvserve.plugins import load_component
from kvserve.request import Request, RequestStatus
from kvserve.sampling_params import SamplingParams

logger = logging.getLogger("kvserve")


@contextmanager
def default_dtype(dtype: torch.dtype):
    """Within the block, new tensors default to ``dtype`` (how models are built in their target dtype)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


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
        self.quant_method = self._quant_method()
        self.dtype = components.resolve_dtype(config, self.platform, self.quant_method)
        self.platform.seed_everything(config.model.seed)
        self.max_model_len = self._max_model_len()
        self.eos_token_ids = self._eos_token_ids(source)

        scheduler_cls, manager_cls = components.resolve_policy_components(config)
        if config.parallel.tensor_parallel_size > 1 and not distributed.is_worker():
            # The driver: workers hold the model shards and their KV caches; it plans and samples.
            self.model = self.runner = None
            self.linear_kernel = self.layer_ops = "chosen by each worker"
            self.executor = self._distributed_executor()
            num_blocks, block_size = self.executor.info.num_kv_blocks, self.executor.info.block_size
            backend_name = f"{self.executor.info.attention_backend} x{config.parallel.tensor_parallel_size} ranks"
        else:
            self.model = self._build_model(source)
            # The backend exists before the cache is sized: it states what a block costs.
            backend_cls, spec = components.resolve_attention(
                config, self.platform, self._attention_shape(), self._attention_layers(), self.dtype
            )
            backend = backend_cls(spec)
            num_blocks, block_size, backend_name = self._num_kv_blocks(backend), spec.block_size, backend_cls.name
        self.num_kv_blocks = num_blocks
        """KV blocks of the cache, the null block included."""
        self.kv_cache_manager = manager_cls(num_blocks, block_size, config.cache.enable_prefix_caching)
        self.scheduler = scheduler_cls(config.scheduler, self.kv_cache_manager, self.max_model_len)
        self.sampler = Sampler(config.model.seed)
        if self.model is not None:
            kv_caches = backend.allocate_kv_cache(num_blocks)
            self.runner = ModelRunner(
                self.model, backend, kv_caches, self.kv_cache_manager, self.platform.device(), self._compiled_forward(),
                config.scheduler.max_num_batched_tokens, config.scheduler.max_num_seqs, self.max_model_len,
            )  # fmt: skip
            self.executor = InProcessExecutor(self.runner)
        else:
            self.executor.kv_cache_manager = self.kv_cache_manager
        self.states: dict[str, RequestState] = {}
        """User requests by id."""
        self.sequences: dict[str, tuple[RequestState, SequenceState]] = {}
        """Scheduler-level requests (one per completion) by id."""
        self.stat_logger = StatLogger()
        self.dead_error: Exception | None = None
        """What stopped the engine (a failed step); None while it runs."""
        self.backend_name = backend_name
        logger.info(
            "kvserve engine: model=%s platform=%s dtype=%s (%s) %s scheduler=%s "
            "kv_cache_manager=%s block_size=%d num_kv_blocks=%d (%d tokens) max_model_len=%d",
            source.path, self.platform.name, str(self.dtype).removeprefix("torch."),
            components.dtype_reason(config, self.platform), self.execution_summary(),
            _scheduler_summary(scheduler_cls.name, config.scheduler), manager_cls.name, block_size, num_blocks - 1,
            (num_blocks - 1) * block_size, self.max_model_len,
        )  # fmt: skip

    def execution_summary(self) -> str:
        """How steps run: optimization level, eager or compiled (with compile seconds so far), the
        attention backend and the kernels it runs, e.g. ``optimization_level=0 (eager)
        attention_backend=cpu (decode and prefill: C++ paged kernel ...) linear_kernel=avx512 (...)
        layer_ops=cpu-native (...)``."""
        level = self.config.compilation.optimization_level
        compiled = self.runner.compiled if self.runner is not None else None
        how = compiled.describe() if compiled is not None else "eager" if level == 0 else "compiled on every rank"
        kernels = self.runner.backend.kernels() if self.runner is not None else ""
        backend = f"{self.backend_name} ({kernels})" if kernels else self.backend_name
        return (
            f"optimization_level={level} ({how}) attention_backend={backend} linear_kernel={self.linear_kernel} "
            f"layer_ops={self.layer_ops}"
        )

    # -- construction -------------------------------------------------------------------
    def _distributed_executor(self) -> Executor:
        if self.config.parallel.distributed_executor_backend == "ray":
            from kvserve.executor.ray_executor import RayExecutor

            return RayExecutor(self.config, self.platform)
        from kvserve.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(self.config, self.platform.distributed_backend)

    def _compiled_forward(self) -> CompiledForward | None:
        """The model's compiled forward at optimization levels 1 and 2; None at level 0 (eager)."""
        compilation = self.config.compilation
        if compilation.optimization_level == 0:
            return None
        freezing = compilation.optimization_level >= 2
        max_tokens = self.config.scheduler.max_num_batched_tokens
        return CompiledForward(self.model, max_tokens, freezing, compilation.compile_cache_dir)

    def _max_model_len(self) -> int:
        limit = getattr(self.hf_config, "max_position_embeddings", None)
        wanted = self.config.model.max_model_len or limit
        if wanted is None:
            raise ConfigError("max_model_len: the model config has no max_position_embeddings; set max_model_len")
        if limit is not None and wanted > limit:
            raise ConfigError(f"max_model_len: {wanted} exceeds the model's max_position_embeddings ({limit})")
        scheduler = self.config.scheduler
        if not scheduler.enable_chunked_prefill and scheduler.max_num_batched_tokens < wanted:
            raise ConfigError(
                f"max_num_batched_tokens: {scheduler.max_num_batched_tokens} is below max_model_len={wanted}, "
                "so a long prompt could never be scheduled without chunked prefill"
            )
        return wanted

    def _eos_token_ids(self, source: Any) -> tuple[int, ...]:
        """EOS ids as HF ``generate`` sees them: generation_config.json, else config, else tokenizer."""
        eos = getattr(self.hf_config, "eos_token_id", None)
        if (Path(source.path) / "generation_config.json").is_file():
            eos = GenerationConfig.from_pretrained(source.path).eos_token_id or eos
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return (eos,) if isinstance(eos, int) else tuple(eos or ())

    def _quant_method(self) -> QuantizationMethod:
        choice = self.config.quantization.quantization
        checkpoint = getattr(self.hf_config, "quantization_config", None)
        if choice == AUTO:
            if not checkpoint:
                return UnquantizedLinearMethod()
            choice = checkpoint["quant_method"] if isinstance(checkpoint, dict) else checkpoint.quant_method
        if choice == "none":
            return UnquantizedLinearMethod()
        if checkpoint is not None and not isinstance(checkpoint, dict):
            checkpoint = checkpoint.to_dict()
        return load_component("quantization_method", choice)(checkpoint)

    def _build_model(self, source: Any) -> torch.nn.Module:
        architectures = getattr(self.hf_config, "architectures", None) or []
        if not architectures:
            raise ConfigError(f"model: {source.path} has no 'architectures' in its config.json")
        model_cls = load_component("model", architectures[0])
        if distributed.world_size() > 1 and not getattr(model_cls, "supports_tensor_parallel", False):
            raise ConfigError(
                f"tensor_parallel_size: the model plugin for {architectures[0]} ({model_cls.__name__}) does not "
                "support tensor parallelism"
            )
        with torch.device(self.platform.device()), default_dtype(self.dtype):
            model = model_cls(self.hf_config, self.quant_method)
        model.load_weights(source.weights())
        for module in model.modules():
            if isinstance(module, LinearBase):
                module.quant_method.process_weights_after_loading(module)
        # At every level: compiled graphs call the kernel on the packed weights as graph inputs.
        kernel = self.platform.linear_kernel()
        self.linear_kernel = "F.linear" if kernel is None else str(pack_linear_weights(model, kernel))
        """Which GEMM the dense linear layers run, for the start-up line."""
        self.layer_ops = self._use_layer_ops(model)
        """Which norm/activation/rope kernels the layers run, for the start-up line."""
        return model.eval()

    def _use_layer_ops(self, model: torch.nn.Module) -> str:
        """Give the model's norm, activation and rope layers the platform's fused ops at level 0;
        compiled levels keep core's PyTorch ops, which inductor fuses (it cannot see into opaque
        kernels). Returns what the start-up line says."""
        if self.config.compilation.optimization_level > 0:
            ops = TorchLayerOps(reason="inductor fuses them")
        else:
            ops = self.platform.layer_ops() or TorchLayerOps()
        use_layer_ops(model, ops)
        return ops.describe()

    def _attention_shape(self) -> tuple[int, int, int]:
        """``(num_heads, num_kv_heads, head_dim)`` from the model's ``attention_shape()``."""
        _, num_heads, num_kv_heads, head_dim = self.model.attention_shape()
        return num_heads, num_kv_heads, head_dim

    def _attention_layers(self) -> tuple[LayerAttentionSpec, ...]:
        """Each attention layer's facts, from the model's PagedAttention modules."""
        name = type(self.model).__name__
        try:
            layers = attention_layers(self.model)
        except ValueError as exc:
            raise ConfigError(f"model: {exc}") from None
        num_layers = self.model.attention_shape()[0]
        if len(layers) != num_layers:
            raise ConfigError(
                f"model: {name}.attention_shape() gives {num_layers} layers, but the model has "
                f"{len(layers)} kvserve.layers.PagedAttention modules"
            )
        return layers

    def _num_kv_blocks(self, backend: AttentionBackend) -> int:
        """Usable blocks + the null block, from the explicit count or the memory budget.

        The budget (``kv_cache_memory``, else the platform's answer after a profiling forward)
        pays for the backend's workspace and every block of every layer, the null block included.
        """
        spec = backend.spec
        block_bytes = backend.kv_cache_bytes_per_block() * spec.num_layers
        blocks_per_seq = math.ceil(self.max_model_len / spec.block_size)
        cache = self.config.cache
        if cache.num_kv_blocks is not None:
            usable, source = cache.num_kv_blocks, "num_kv_blocks"
        else:
            budget = cache.kv_cache_memory
            if budget is None:
                peak = self._profile_peak_memory(backend)
                budget = self.platform.kv_cache_memory_bytes(peak, cache.kv_cache_memory_fraction)
            usable = (budget - backend.workspace_bytes()) // block_bytes - 1
            # No point reserving more than max_num_seqs full-length sequences can use.
            usable = min(usable, self.config.scheduler.max_num_seqs * blocks_per_seq)
            source = "kv_cache_memory"
        if usable < blocks_per_seq:
            raise ConfigError(
                f"{source}: {max(usable, 0)} KV blocks of {spec.block_size} tokens ({block_bytes} bytes each, "
                f"{backend.workspace_bytes()} bytes of {type(backend).name} workspace aside) cannot hold one "
                f"sequence of max_model_len={self.max_model_len} ({blocks_per_seq} blocks); "
                f"raise {source} or lower max_model_len"
            )
        return usable + 1

    def _profile_peak_memory(self, backend: AttentionBackend) -> int:
        """Peak activation bytes of the largest step the scheduler can plan, as the platform measures it."""
        scheduler = self.config.scheduler
        return profile_peak_memory(
            self.model, backend, self.platform, scheduler.max_num_batched_tokens, self.max_model_len,
            scheduler.max_num_seqs,
        )  # fmt: skip

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
            step = self.executor.execute(plan)
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
        their sequence, then the followers of a leader that just finished its prompt (its row)."""
        completing = [plan.scheduled[i].request for i in step.completing]
        owners, rows = list(completing), list(range(len(completing)))
        for row, request in enumerate(completing):
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
        for follower in owners[len(step.completing) :]:
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
        if stop is not None:
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
            state.prompt_logprobs.extend(top_logprobs(logits.log_softmax(dim=-1), targets, top_n))

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
