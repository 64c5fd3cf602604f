"""Loading a ``(name, tensor)`` checkpoint stream into a model built from ``kvserve.layers``.

Linear layers say which checkpoint names they hold (their shard prefixes times their
parameters) and, like vocab embeddings, cut their tensor-parallel rank's part of each tensor;
every other module's parameters keep their own module path. A module may declare
``optional_params`` (e.g. the attention layer's KV-cache scales) that a checkpoint may omit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from kvserve.errors import WeightLoadError
from kvserve.layers.embedding import VocabEmbedding
from kvserve.layers.linear import LinearBase

# Per-layer KV-cache scales as quantization tools name them -> the attention layer's parameters.
_KV_SCALE_NAMES = (
    (re.compile(r"\.self_attn\.([kv])_scale$"), r".self_attn.attn.\1_scale"),
    (re.compile(r"\.self_attn\.([kv])_proj\.output_scale$"), r".self_attn.attn.\1_scale"),
)


def kv_scale_name(name: str) -> str:
    """Map a checkpoint's KV-cache scale (``...self_attn.k_scale``, compressed-tensors'
    ``...self_attn.k_proj.output_scale``) onto the ``PagedAttention`` under ``self_attn.attn``."""
    for pattern, replacement in _KV_SCALE_NAMES:
        if pattern.search(name):
            return pattern.sub(replacement, name)
    return name


@dataclass
class _Target:
    module: torch.nn.Module
    param: str
    shard: int | None
    """Shard index of a linear layer; None for a plain parameter."""
    optional: bool

    def load(self, name: str, tensor: torch.Tensor) -> None:
        if self.shard is not None:
            self.module.load(self.param, tensor, self.shard)
            return
        if isinstance(self.module, VocabEmbedding):  # it keeps its tensor-parallel rank's rows
            self.module.load(tensor, name)
            return
        data = getattr(self.module, self.param).data
        if tensor.shape != data.shape:
            if tensor.numel() != 1 or data.numel() != 1:
                raise WeightLoadError(f"{name}: expected shape {tuple(data.shape)}, got {tuple(tensor.shape)}")
            tensor = tensor.reshape(data.shape)
        data.copy_(tensor)


def checkpoint_targets(model: torch.nn.Module) -> dict[str, _Target]:
    """Every checkpoint tensor name the model can take, and where it goes."""
    targets: dict[str, _Target] = {}
    for module_name, module in model.named_modules():
        if isinstance(module, LinearBase):
            for shard, shard_prefix in enumerate(module.shard_prefixes):
                for param, loading in module.param_loading.items():
                    targets[f"{shard_prefix}.{param}"] = _Target(module, param, shard, loading.optional)
            continue
        if isinstance(module, VocabEmbedding):
            if module.quantized is None:  # else its linear layer (visited next) names its tensors
                targets[f"{module_name}.weight"] = _Target(module, "weight", None, False)
            continue
        optional = getattr(module, "optional_params", ())
        for param, _ in module.named_parameters(recurse=False):
            name = f"{module_name}.{param}" if module_name else param
            targets[name] = _Target(module, param, None, param in optional)
    return targets


def load_checkpoint(
    model: torch.nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    skip: Callable[[str], bool] = lambda name: False,
    rename: Callable[[str], str] = kv_scale_name,
) -> None:
    """Copy every tensor of ``weights`` into its place in ``model`` (cast to the parameter's
    dtype and device); ``skip`` names checkpoint tensors to drop (a tied ``lm_head.weight``),
    ``rename`` maps checkpoint names onto module paths.

    Raises :class:`WeightLoadError` naming a tensor with no place in the model, a shape that does
    not fit, or the required tensors the checkpoint lacks.
    """
    targets = checkpoint_targets(model)
    required = {name for name, target in targets.items() if not target.optional}
    for checkpoint_name, tensor in weights:
        if skip(checkpoint_name):
            continue
        name = rename(checkpoint_name)
        target = targets.get(name)
        if target is None:
            raise WeightLoadError(_no_place(model, checkpoint_name, targets))
        target.load(name, tensor)
        required.discard(name)
    if required:
        raise WeightLoadError(f"checkpoint lacks {len(required)} tensors, e.g. {sorted(required)[:5]}")


def _no_place(model: torch.nn.Module, name: str, targets: dict[str, _Target]) -> str:
    """The error for a stray tensor: what its layer holds instead, when the layer exists."""
    message = f"checkpoint tensor {name!r} has no place in {type(model).__name__}"
    module_name = name.rpartition(".")[0]
    held = sorted(n.rpartition(".")[2] for n in targets if n.rpartition(".")[0] == module_name)
    if held:
        layer = next(t.module for n, t in targets.items() if n.rpartition(".")[0] == module_name)
        method = getattr(layer, "quant_method", None)
        how = f" (quantization method {method.name!r})" if method is not None else ""
        message += f": {module_name} holds {held}{how}"
    return message
