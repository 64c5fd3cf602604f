"""Build a ModelRunner from an EngineConfig: the model (this rank's shard), its LoRA slots with
``enable_lora``, its attention backend, the KV cache sized to the budget, and the compiled forward
at optimization levels 1 and 2.

The in-process engine and every tensor-parallel worker call :func:`build_runner`; neither
needs a scheduler, a sampler or a tokenizer for it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kvserve import distributed
from kvserve.components import resolve_attention
from kvserve.config import EngineConfig
from kvserve.errors import ConfigError
from kvserve.interfaces import AttentionBackend, LayerAttentionSpec, Platform
from kvserve.layers import (
    EagerAndGraphLayerOps,
    LinearBase,
    TorchLayerOps,
    attention_layers,
    checkpoint_targets,
    pack_linear_weights,
    use_layer_ops,
)
from kvserve.lora.layers import LoRASlots
from kvserve.lora.torch_kernel import TorchLoRAKernel
from kvserve.plugins import load_component
from kvserve.runner.compilation import CompiledForward
from kvserve.runner.model_runner import ModelRunner, RunnerInfo
from kvserve.runner.model_settings import ModelSettings
from kvserve.runner.profiling import profile_peak_memory


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Within the block, new tensors default to ``dtype`` (how models are built in their target dtype)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_runner(config: EngineConfig, platform: Platform, source: Any, settings: ModelSettings) -> ModelRunner:
    """The runner of ``source`` (an opened checkpoint: ``hf_config``, ``path``, ``weights_for()``) on
    ``platform``'s device: this rank's shard when :mod:`kvserve.distributed` is initialized.

    The backend exists before the cache is sized: it states what a block costs. Raises a
    ConfigError naming the field when the model, backend or cache cannot be had."""
    model, linear_kernel = _build_model(config, platform, source, settings)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    layer_ops = _use_layer_ops(config, platform, model)
    lora = _lora_slots(config, platform, model)  # before the cache is sized: the slots take memory
    backend_cls, spec = resolve_attention(
        config, platform, _attention_shape(model), _attention_layers(model), settings.dtype
    )
    backend = backend_cls(spec)
    num_blocks = _num_kv_blocks(config, platform, model, backend, settings.max_model_len)
    info = RunnerInfo(
        num_blocks, spec.block_size, backend_cls.name, linear_kernel, layer_ops, weight_bytes=weight_bytes
    )
    if lora is not None:
        info = dataclasses.replace(info, lora_kernel=lora.step.kernel.name, lora_targets=lora.targets)
    scheduler = config.scheduler
    runner = ModelRunner(
        model, backend, backend.allocate_kv_cache(num_blocks), info, platform.device(),
        _compiled_forward(config, model), scheduler.max_num_batched_tokens, scheduler.max_num_seqs,
        settings.max_model_len, lora,
    )  # fmt: skip
    if runner.compiled is not None:
        runner.compile_buckets()
    return runner


def _build_model(
    config: EngineConfig, platform: Platform, source: Any, settings: ModelSettings
) -> tuple[torch.nn.Module, str]:
    """The loaded model in eval mode, and which GEMM its dense linear layers run."""
    architectures = getattr(source.hf_config, "architectures", None) or []
    if not architectures:
        raise ConfigError(f"model: {source.path} has no 'architectures' in its config.json")
    model_cls = load_component("model", architectures[0])
    if distributed.world_size() > 1 and not getattr(model_cls, "supports_tensor_parallel", False):
        raise ConfigError(
            f"tensor_parallel_size: the model plugin for {architectures[0]} ({model_cls.__name__}) does not "
            "support tensor parallelism"
        )
    with torch.device(platform.device()), default_dtype(settings.dtype):
        model = model_cls(source.hf_config, settings.quant_method)
    model.load_weights(source.weights_for(checkpoint_targets(model).keys()))
    for module in model.modules():
        if isinstance(module, LinearBase):
            module.quant_method.process_weights_after_loading(module)
    # At every level: compiled graphs call the kernel on the packed weights as graph inputs.
    kernel = platform.linear_kernel()
    linear_kernel = "F.linear" if kernel is None else str(pack_linear_weights(model, kernel))
    return model.eval(), linear_kernel


def _lora_slots(config: EngineConfig, platform: Platform, model: torch.nn.Module) -> LoRASlots | None:
    """With ``enable_lora``, ``max_loras`` slots beside every linear layer, run by the platform's
    LoRA kernel (core's PyTorch one where it has none); None without."""
    lora = config.lora
    if not lora.enable_lora:
        return None
    kernel = platform.lora_kernel() or TorchLoRAKernel()
    return LoRASlots(model, kernel, lora.max_loras, lora.max_lora_rank)


def _use_layer_ops(config: EngineConfig, platform: Platform, model: torch.nn.Module) -> str:
    """Give the model's norm, activation and rope layers the platform's fused ops; inside compiled
    graphs they keep core's PyTorch ops, which inductor fuses (it cannot see into opaque kernels).
    Returns what the start-up line says."""
    ops = platform.layer_ops() or TorchLayerOps()
    if config.compilation.optimization_level > 0:
        ops = EagerAndGraphLayerOps(ops)
    use_layer_ops(model, ops)
    return ops.describe()


def _compiled_forward(config: EngineConfig, model: torch.nn.Module) -> CompiledForward | None:
    """The model's compiled forward at optimization levels 1 and 2, for steps up to the largest decode
    step (every running sequence's token and its drafts); None at level 0 (eager)."""
    compilation = config.compilation
    if compilation.optimization_level == 0:
        return None
    scheduler, speculative = config.scheduler, config.decoding.speculative_config
    tokens_per_seq = 1 + (speculative.num_speculative_tokens if speculative is not None else 0)
    decode_tokens = min(scheduler.max_num_batched_tokens, scheduler.max_num_seqs * tokens_per_seq)
    freezing = compilation.optimization_level >= 2
    return CompiledForward(model, decode_tokens, freezing, compilation.compile_cache_dir)


def _attention_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """``(num_heads, num_kv_heads, head_dim)`` from the model's ``attention_shape()``."""
    _, num_heads, num_kv_heads, head_dim = model.attention_shape()
    return num_heads, num_kv_heads, head_dim


def _attention_layers(model: torch.nn.Module) -> tuple[LayerAttentionSpec, ...]:
    """Each attention layer's facts, from the model's PagedAttention modules."""
    name = type(model).__name__
    try:
        layers = attention_layers(model)
    except ValueError as exc:
        raise ConfigError(f"model: {exc}") from None
    num_layers = model.attention_shape()[0]
    if len(layers) != num_layers:
        raise ConfigError(
            f"model: {name}.attention_shape() gives {num_layers} layers, but the model has "
            f"{len(layers)} kvserve.layers.PagedAttention modules"
        )
    return layers


def _num_kv_blocks(
    config: EngineConfig, platform: Platform, model: torch.nn.Module, backend: AttentionBackend, max_model_len: int
) -> int:
    """Usable blocks + the null block, from the explicit count or the memory budget.

    The budget (``kv_cache_memory``, else the platform's answer after a profiling forward)
    pays for the backend's workspace and every block of every layer, the null block included.
    """
    spec = backend.spec
    block_bytes = backend.kv_cache_bytes_per_block() * spec.num_layers
    blocks_per_seq = math.ceil(max_model_len / spec.block_size)
    cache, scheduler = config.cache, config.scheduler
    if cache.num_kv_blocks is not None:
        usable, source = cache.num_kv_blocks, "num_kv_blocks"
    else:
        budget = cache.kv_cache_memory
        if budget is None:
            peak = profile_peak_memory(
                model, backend, platform, scheduler.max_num_batched_tokens, max_model_len, scheduler.max_num_seqs
            )
            budget = platform.kv_cache_memory_bytes(peak, cache.kv_cache_memory_fraction)
        usable = (budget - backend.workspace_bytes()) // block_bytes - 1
        # No point reserving more than max_num_seqs full-length sequences can use.
        usable = min(usable, scheduler.max_num_seqs * blocks_per_seq)
        source = "kv_cache_memory"
    if usable < blocks_per_seq:
        raise ConfigError(
            f"{source}: {max(usable, 0)} KV blocks of {spec.block_size} tokens ({block_bytes} bytes each, "
            f"{backend.workspace_bytes()} bytes of {type(backend).name} workspace aside) cannot hold one "
            f"sequence of max_model_len={max_model_len} ({blocks_per_seq} blocks); "
            f"raise {source} or lower max_model_len"
        )
    return usable + 1
