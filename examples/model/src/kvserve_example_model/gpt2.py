"""GPT-2 on kvserve's paged KV cache: learned positions, LayerNorm, fused qkv, GELU, tied head.

Linear layers are ``kvserve.layers.ColumnLinear`` / ``RowLinear`` (their weights belong to the quantization
method); attention is ``kvserve.layers.PagedAttention``, which calls the engine's backend.
Parameter names mirror the checkpoint's without the ``transformer.`` prefix.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F

from kvserve.forward_context import ForwardContext
from kvserve.interfaces import QuantizationMethod
from kvserve.layers import ColumnLinear, PagedAttention, RowLinear, load_checkpoint

# GPT-2 checkpoints store these as transformers Conv1D weights, [in, out]: transposed on load.
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


class Embedding(torch.nn.Module):
    """A ``[num, dim]`` table, left uninitialised: ``load_weights`` fills it."""

    def __init__(self, num: int, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(num, dim), requires_grad=False)


class GPT2Block(torch.nn.Module):
    """Pre-norm residual block: causal self-attention, then a GELU MLP."""

    def __init__(self, config: Any, layer_idx: int, quant_method: QuantizationMethod) -> None:
        super().__init__()
        hidden, heads = config.n_embd, config.n_head
        self.num_heads, self.head_dim = heads, hidden // heads
        self.ln_1 = torch.nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.attn = torch.nn.Module()
        prefix = f"h.{layer_idx}"
        self.attn.c_attn = ColumnLinear(hidden, 3 * hidden, True, quant_method, f"{prefix}.attn.c_attn")
        self.attn.c_proj = RowLinear(hidden, hidden, True, quant_method, f"{prefix}.attn.c_proj")
        self.attn.paged = PagedAttention(heads, heads, self.head_dim, self.head_dim**-0.5, layer_idx)
        self.ln_2 = torch.nn.LayerNorm(hidden, eps=config.layer_norm_epsilon)
        self.mlp = torch.nn.Module()
        inner = config.n_inner or 4 * hidden
        self.mlp.c_fc = ColumnLinear(hidden, inner, True, quant_method, f"{prefix}.mlp.c_fc")
        self.mlp.c_proj = RowLinear(inner, hidden, True, quant_method, f"{prefix}.mlp.c_proj")

    def forward(self, hidden: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        q, k, v = self.attn.c_attn(self.ln_1(hidden)).split(hidden.shape[-1], dim=-1)
        shape = (-1, self.num_heads, self.head_dim)
        hidden = hidden + self.attn.c_proj(self.attn.paged(q.view(shape), k.view(shape), v.view(shape), ctx))
        return hidden + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(hidden)), approximate="tanh"))


class GPT2LMHeadModel(torch.nn.Module):
    """The ``GPT2LMHeadModel`` architecture; the LM head is the token embedding (tied)."""

    def __init__(self, hf_config: Any, quant_method: QuantizationMethod) -> None:
        super().__init__()
        if hf_config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"activation_function {hf_config.activation_function!r} is not supported")
        if hf_config.scale_attn_by_inverse_layer_idx or hf_config.reorder_and_upcast_attn:
            raise ValueError("scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn are not supported")
        self.config = hf_config
        self.wte = Embedding(hf_config.vocab_size, hf_config.n_embd)
        self.wpe = Embedding(hf_config.n_positions, hf_config.n_embd)
        self.h = torch.nn.ModuleList(GPT2Block(hf_config, i, quant_method) for i in range(hf_config.n_layer))
        self.ln_f = torch.nn.LayerNorm(hf_config.n_embd, eps=hf_config.layer_norm_epsilon)

    def attention_shape(self) -> tuple[int, int, int, int]:
        config = self.config
        return config.n_layer, config.n_head, config.n_head, config.n_embd // config.n_head

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        hidden = F.embedding(input_ids, self.wte.weight) + F.embedding(positions, self.wpe.weight)
        for block in self.h:
            hidden = block(hidden, ctx)
        return self.ln_f(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.wte.weight).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors in; ``WeightLoadError`` names a tensor with no place, or the ones missing."""

        def renamed() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                name = name.removeprefix("transformer.")  # the checkpoint's names, without "transformer."
                yield name, tensor.T if name.endswith(CONV1D) else tensor

        def skip(name: str) -> bool:  # the tied head, and causal-mask buffers of old checkpoints
            return name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias"))

        load_checkpoint(self, renamed(), skip=skip)
