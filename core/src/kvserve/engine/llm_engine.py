"""The synchronous engine: requests in, one batched step at a time, outputs back."""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig

from kvserve.config import AUTO, EngineConfig
from kvserve.engine import components
from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.engine.model_runner import ModelRunner
from kvserve.engine.sampler import Sampler
from kvserve.errors import CapacityError, ConfigError
from kvserve.interfaces import QuantizationMethod
from kvserve.layers import QuantLinear, UnquantizedLinearMethod
from kvserve.logging_setup import configure_logging
from kvserve.outputs import CompletionOutput, RequestOutput
from kvserve.plugins import load_component
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams

logger = logging.getLogger("kvserve")


@contextmanager
def _default_dtype(dtype: torch.dtype):
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
        self.dtype = components.resolve_dtype(config, self.platform)
        self.platform.seed_everything(config.model.seed)
        source = open_model(config.model.model, config.model.tokenizer)
        self.tokenizer = source.tokenizer
        self.model_path = source.path
        self.hf_config = source.hf_config
        self.max_model_len = self._max_model_len()
        self.eos_token_ids = self._eos_token_ids(source)

        self.model = self._build_model(source)
        num_layers, *shape = self.model.attention_shape()
        backend_cls, spec = components.resolve_attention(config, self.platform, tuple(shape), self.dtype)
        scheduler_cls, manager_cls = components.resolve_policy_components(config)
        num_blocks = self._num_kv_blocks(backend_cls, spec, num_layers)
        device = self.platform.device()
        kv_shape = backend_cls.kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        kv_caches = [torch.zeros(kv_shape, dtype=self.dtype, device=device) for _ in range(num_layers)]
        self.kv_cache_manager = manager_cls(num_blocks, spec.block_size, config.cache.enable_prefix_caching)
        self.scheduler = scheduler_cls(config.scheduler, self.kv_cache_manager, self.max_model_len)
        self.sampler = Sampler(config.model.seed)
        self.runner = ModelRunner(self.model, backend_cls(spec), kv_caches, self.kv_cache_manager, self.sampler, device)
        self.requests: dict[str, Request] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        self.num_preemptions = 0
        logger.info(
            "kvserve engine: model=%s platform=%s dtype=%s attention_backend=%s scheduler=%s "
            "kv_cache_manager=%s block_size=%d num_kv_blocks=%d (%d tokens) max_model_len=%d",
            source.path, self.platform.name, str(self.dtype).removeprefix("torch."), backend_cls.name,
            scheduler_cls.name, manager_cls.name, spec.block_size, num_blocks - 1,
            (num_blocks - 1) * spec.block_size, self.max_model_len,
        )  # fmt: skip

    # -- construction -------------------------------------------------------------------
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
        return load_component("quantization_method", choice)(checkpoint)

    def _build_model(self, source: Any) -> torch.nn.Module:
        architectures = getattr(self.hf_config, "architectures", None) or []
        if not architectures:
            raise ConfigError(f"model: {source.path} has no 'architectures' in its config.json")
        model_cls = load_component("model", architectures[0])
        quant_method = self._quant_method()
        with torch.device(self.platform.device()), _default_dtype(self.dtype):
            model = model_cls(self.hf_config, quant_method)
        model.load_weights(source.weights())
        for module in model.modules():
            if isinstance(module, QuantLinear):
                module.quant_method.process_weights_after_loading(module)
        return model.eval()

    def _num_kv_blocks(self, backend_cls: Any, spec: Any, num_layers: int) -> int:
        """Usable blocks + the null block, from the explicit count or the memory budget."""
        per_block = math.prod(backend_cls.kv_cache_shape(1, spec.block_size, spec.num_kv_heads, spec.head_dim))
        block_bytes = per_block * self.dtype.itemsize * num_layers
        blocks_per_seq = math.ceil(self.max_model_len / spec.block_size)
        cache = self.config.cache
        if cache.num_kv_blocks is not None:
            usable, source = cache.num_kv_blocks, "num_kv_blocks"
        else:
            budget = cache.kv_cache_memory or self.platform.kv_cache_memory_bytes()
            # No point reserving more than max_num_seqs full-length sequences can use.
            usable = min(budget // block_bytes, self.config.scheduler.max_num_seqs * blocks_per_seq)
            source = "kv_cache_memory"
        if usable < blocks_per_seq:
            raise ConfigError(
                f"{source}: {usable} KV blocks of {spec.block_size} tokens cannot hold one sequence of "
                f"max_model_len={self.max_model_len} ({blocks_per_seq} blocks); raise {source} or lower max_model_len"
            )
        return usable + 1

    # -- requests -------------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, priority: int = 0
    ) -> None:
        """Queue a request; raises (naming the field) if it can never run, leaving the engine untouched."""
        if request_id in self.requests:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        if not prompt_token_ids:
            raise ValueError("prompt: empty prompt")
        vocab = self.hf_config.vocab_size
        bad = [t for t in prompt_token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt_token_ids: {bad[:5]} outside the vocabulary [0, {vocab})")
        if len(prompt_token_ids) >= self.max_model_len:
            raise CapacityError(
                f"prompt: {len(prompt_token_ids)} tokens leave no room to generate within max_model_len="
                f"{self.max_model_len}"
            )
        request = Request(request_id, list(prompt_token_ids), params, self.eos_token_ids, priority=priority)
        self.requests[request_id] = request
        self.detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens)
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str) -> None:
        if self.scheduler.abort_request(request_id) is not None:
            self._forget(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one batched step; outputs of the requests that gained a token (or finished)."""
        plan = self.scheduler.schedule()
        self.num_preemptions += len(plan.preempted)
        if not plan.scheduled:
            return []
        sampled = self.runner.execute(plan)
        sampling = [item.request for item in plan.scheduled if item.completes_sequence]
        finished = {r.request_id for r in self.scheduler.update(plan, sampled)}
        outputs = []
        for request in sampling:
            if request.status.finished and request.request_id not in finished:
                continue  # aborted while the step ran
            self.detokenizers[request.request_id].add(request.output_token_ids[-1])
            outputs.append(self._output(request))
            if request.request_id in finished:
                self._forget(request.request_id)
        return outputs

    def _output(self, request: Request) -> RequestOutput:
        completion = CompletionOutput(
            index=0,
            text=self.detokenizers[request.request_id].text,
            token_ids=list(request.output_token_ids),
            finish_reason=request.status.finish_reason,
            stop_reason=request.stop_reason,
        )
        return RequestOutput(request.request_id, None, request.prompt_token_ids, [completion], request.status.finished)

    def _forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.detokenizers.pop(request_id, None)
        self.sampler.forget(request_id)
