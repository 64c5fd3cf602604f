"""Rotary position embedding (neox style, as HF Llama), with HF's rope scaling types."""

from __future__ import annotations

from typing import Any

import torch

from kvserve.layers.layer_ops import LayerOpsModule


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """The config's rope parameters in transformers' current form (``rope_type``, ``rope_theta``...)."""
    params = getattr(hf_config, "rope_parameters", None)
    if params is None:  # transformers < 5 kept them apart
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        params.setdefault("rope_type", params.pop("type", "default"))
    return dict(params)


class RotaryEmbedding(LayerOpsModule):
    """Applies RoPE to query and key given each token's absolute position.

    The inverse frequencies come from transformers' own rope initialisers, so every rope
    type HF supports for these configs (linear, llama3, yarn, longrope) matches HF exactly.
    Dynamic NTK scaling depends on the running sequence length and is refused.

    ``layer_type`` selects one entry of a config whose rope parameters are given per layer
    type (Gemma 3: ``rope_parameters["sliding_attention"]`` and ``["full_attention"]``).
    """

    def __init__(
        self,
        hf_config: Any,
        head_dim: int,
        max_position: int,
        layer_type: str | None = None,
        device: torch.device | None = None,
    ) -> None:
        """``device``: where the cos/sin tables live; None: torch's default device, which inside the
        engine's model-building ``torch.device`` context is the platform's device."""
        super().__init__()
        params = rope_parameters(hf_config)
        if layer_type is not None:
            if layer_type not in params:
                raise ValueError(f"rope_parameters has no entry for layer type {layer_type!r} (has {sorted(params)})")
            params = dict(params[layer_type])
        rope_type = params.get("rope_type", "default")
        if rope_type == "dynamic":
            raise ValueError("rope_scaling type 'dynamic' is not supported (position-dependent frequencies)")
        # The tables are computed once on the host on purpose (the numbers HF's CPU run computes,
        # whatever the device), then copied to the device.
        host = torch.device("cpu")
        if rope_type == "default":
            theta = params["rope_theta"]
            inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=host) / head_dim))
            scaling = 1.0
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            by_type = {} if layer_type is None else {"layer_type": layer_type}
            with host:  # transformers' initialisers make some tensors on the default device
                inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, host, **by_type)
        positions = torch.arange(max_position, dtype=torch.float, device=host)
        freqs = torch.outer(positions, inv_freq.to(host, torch.float))
        target = torch.get_default_device() if device is None else device
        self.register_buffer("cos", (freqs.cos() * scaling).to(target), persistent=False)
        self.register_buffer("sin", (freqs.sin() * scaling).to(target), persistent=False)

    def forward(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor):
        """``query``/``key``: ``[num_tokens, heads, head_dim]``; returns both rotated."""
        return self.ops.rotary_embedding(positions, query, key, self.cos, self.sin)
