"""Reading a PEFT LoRA adapter directory and checking it against the base model's linear layers."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvserve.lora.request import LoRARequest

_WEIGHT = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<side>[AB])\.weight$")
_REFUSED = {
    "use_dora": "DoRA adapters (use_dora) are not supported",
    "modules_to_save": "modules_to_save (fully trained extra modules) are not supported",
    "rank_pattern": "per-module ranks (rank_pattern) are not supported yet",
    "alpha_pattern": "per-module alphas (alpha_pattern) are not supported yet",
    "lora_bias": "LoRA biases (lora_bias) are not supported",
}


@dataclass(frozen=True)
class LoRAAdapter:
    """A loaded adapter: per base module (its checkpoint name), ``(A [r, in], B [out, r])`` with the
    adapter's scale folded into ``B``, in float32 on the host."""

    request: LoRARequest
    rank: int
    scaling: float
    modules: dict[str, tuple[torch.Tensor, torch.Tensor]]


def load_peft_adapter(request: LoRARequest, max_rank: int, targets: dict[str, tuple[int, int]]) -> LoRAAdapter:
    """The adapter in ``request.lora_path`` (``adapter_config.json`` and ``adapter_model.safetensors``
    or ``adapter_model.bin``), checked against ``targets``: the base model's LoRA-capable modules by
    checkpoint name, each ``(input features, output features)``.

    ValueError, naming the adapter and the problem (the file, the config field, the module): a path
    that is no adapter directory, a config that is not LoRA or uses what is not supported (DoRA,
    ``bias``, ``modules_to_save``, per-module patterns), a rank above ``max_rank``, a weight file
    that cannot be read or holds a tensor that is no LoRA linear weight, a module the base lacks or
    whose shapes differ from the base's.
    """
    where = _where(request)
    folder = Path(request.lora_path)
    config = read_adapter_config(request)
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{where}: adapter_config.json has no positive int 'r' (got {rank!r})")
    if rank > max_rank:
        raise ValueError(f"{where}: rank r={rank} exceeds max_lora_rank={max_rank}; raise max_lora_rank")
    if not isinstance(alpha, (int, float)):
        raise ValueError(f"{where}: adapter_config.json has no numeric 'lora_alpha' (got {alpha!r})")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    others = []
    for key, tensor in _read_weights(folder, where).items():
        match = _WEIGHT.match(key)
        if match is None:
            others.append(key)
        else:
            pairs.setdefault(match["module"], {})[match["side"]] = tensor
    for module in sorted(pairs):  # first: a LoRA on an unsupported module says more than its side tensors
        if module not in targets:
            raise ValueError(
                f"{where}: module {module!r} is not a linear layer of the base model that LoRA can target "
                "(q/k/v/o and gate/up/down projections; embeddings and lm_head come later)"
            )
    if others:
        raise ValueError(
            f"{where}: tensor {others[0]!r} is not a LoRA linear weight (lora_A / lora_B of a module); full "
            "weights (saved embedding layers, modules_to_save) are not supported"
        )
    if not pairs:
        raise ValueError(f"{where}: the weight file holds no LoRA weights")
    modules = {}
    for module, sides in sorted(pairs.items()):
        if set(sides) != {"A", "B"}:
            raise ValueError(f"{where}: module {module!r} has lora_{''.join(sides)} but not both lora_A and lora_B")
        a, b = sides["A"].float(), sides["B"].float()
        in_features, out_features = targets[module]
        if a.shape != (rank, in_features) or b.shape != (out_features, rank):
            raise ValueError(
                f"{where}: module {module!r} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}; the base "
                f"layer and r={rank} need ({rank}, {in_features}) and ({out_features}, {rank})"
            )
        modules[module] = (a, b * scaling)
    return LoRAAdapter(request, rank, scaling, modules)


def _where(request: LoRARequest) -> str:
    return f"LoRA adapter {request.lora_name!r} ({request.lora_path})"


def read_adapter_config(request: LoRARequest) -> dict[str, Any]:
    """The adapter's ``adapter_config.json``; ValueError, naming the adapter and the problem, for a path
    that is no adapter directory or a config that is no LoRA or uses what is not supported (DoRA,
    ``bias``, ``modules_to_save``, per-module patterns). A cheap check: no weights are read."""
    where, folder = _where(request), Path(request.lora_path)
    path = folder / "adapter_config.json"
    if not folder.is_dir():
        raise ValueError(f"{where}: no such directory")
    if not path.is_file():
        raise ValueError(f"{where}: no adapter_config.json; a PEFT adapter directory holds one")
    try:
        config = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: adapter_config.json is not JSON: {exc}") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else type(config).__name__
        raise ValueError(f"{where}: adapter_config.json is not a LoRA config (peft_type {kind!r})")
    for field, reason in _REFUSED.items():
        if config.get(field):
            raise ValueError(f"{where}: {reason} ({field}={config[field]!r})")
    if config.get("bias", "none") != "none":
        raise ValueError(f"{where}: trained biases are not supported (bias={config['bias']!r}; only 'none')")
    return config


def _read_weights(folder: Path, where: str) -> dict[str, torch.Tensor]:
    safetensors_file, bin_file = folder / "adapter_model.safetensors", folder / "adapter_model.bin"
    try:
        if safetensors_file.is_file():
            from safetensors.torch import load_file

            return load_file(safetensors_file)
        if bin_file.is_file():
            weights = torch.load(bin_file, map_location="cpu", weights_only=True)
            if not isinstance(weights, dict):
                raise ValueError(f"it holds a {type(weights).__name__}, not a state dict")
            return weights
    except Exception as exc:  # a corrupt file: safetensors, pickle and zip errors alike
        name = safetensors_file.name if safetensors_file.is_file() else bin_file.name
        raise ValueError(f"{where}: cannot read {name}: {exc}") from None
    raise ValueError(f"{where}: no adapter_model.safetensors or adapter_model.bin")
