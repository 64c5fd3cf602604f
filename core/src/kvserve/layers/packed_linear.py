"""Dense linear layers (and the LM head) moved onto a platform's :class:`LinearKernel` after loading."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.interfaces.linear_kernel import LinearKernel
from kvserve.layers.decoder import GatedMLP
from kvserve.layers.embedding import VocabEmbedding
from kvserve.layers.linear import LinearBase, UnquantizedLinearMethod


class PackedLinearMethod(UnquantizedLinearMethod):
    """Dense weights that ``kernel`` repacked: the layer's ``weight`` is the packed tensor (still
    unquantized, so the method keeps the name ``"none"``)."""

    def __init__(self, kernel: LinearKernel) -> None:
        super().__init__()
        self.kernel = kernel

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.kernel.apply(x, layer.weight, bias)


@dataclass(frozen=True)
class PackingReport:
    """What :func:`pack_linear_weights` moved onto the kernel, for the start-up line."""

    kernel: str
    packed_layers: int
    dense_layers: int
    """Unquantized linear layers the kernel left on ``F.linear`` (its choice, by shape or dtype)."""
    lm_head: bool
    quantized_layers: int = 0
    """Quantized linear layers whose method moved them onto the kernel (``use_linear_kernel``)."""
    gated_mlps: int = 0
    """Gated MLPs whose gate, up and activation run as one kernel call (:meth:`LinearKernel.apply_gated`)."""

    def __str__(self) -> str:
        head = " + lm_head" if self.lm_head else ""
        quantized = f" + {self.quantized_layers} quantized" if self.quantized_layers else ""
        gated = f"; {self.gated_mlps} gated MLPs fused" if self.gated_mlps else ""
        layers = f"{self.packed_layers}/{self.packed_layers + self.dense_layers} linear layers"
        return f"{self.kernel} ({layers}{head}{quantized}{gated})"


def pack_linear_weights(model: torch.nn.Module, kernel: LinearKernel) -> PackingReport:
    """Repack, once after loading, every unquantized linear layer's weight and the model's
    ``lm_head`` (a :class:`VocabEmbedding`) where ``kernel.pack`` takes them.

    Layers of a quantization method (or of a subclass of the unquantized one) keep their
    parameters in the method's own format: the method moves them onto the kernel itself where the
    kernel runs that format (``QuantizationMethod.use_linear_kernel``). The dense weight a packed
    one replaces is freed; a tied LM head keeps it, as the token embedding still reads it. A gated
    MLP whose gate and up are both packed here, without bias, runs them and its activation as one
    kernel call where the kernel fuses that activation (:meth:`LinearKernel.fuses_gated`).
    """
    method = PackedLinearMethod(kernel)
    packed = dense = quantized = 0
    for module in model.modules():
        if not isinstance(module, LinearBase):
            continue
        if type(module.quant_method) is not UnquantizedLinearMethod:
            quantized += module.quant_method.use_linear_kernel(module, kernel)
            continue
        weight = kernel.pack(module.weight.data)
        if weight is None:
            dense += 1
            continue
        module.weight = torch.nn.Parameter(weight, requires_grad=False)
        module.quant_method = method
        packed += 1
    head = getattr(model, "lm_head", None)
    lm_head = False
    if isinstance(head, VocabEmbedding):
        tied = sum(m is head for _, m in model.named_modules(remove_duplicate=False)) > 1
        lm_head = head.pack_head(kernel, keep_embedding=tied)
    gated = sum(_fuse_gated(mlp, kernel, method) for mlp in model.modules() if isinstance(mlp, GatedMLP))
    return PackingReport(kernel.name, packed, dense, lm_head, quantized, gated)


def _fuse_gated(mlp: GatedMLP, kernel: LinearKernel, method: PackedLinearMethod) -> bool:
    """Give ``mlp`` the kernel's gated call where both projections are this packing's, without bias."""
    gate, up = mlp.gate_proj, mlp.up_proj
    if gate.quant_method is not method or up.quant_method is not method or gate.bias is not None or up.bias is not None:
        return False
    if not kernel.fuses_gated(mlp.activation, gate.weight):
        return False
    mlp.gated_kernel = kernel
    return True
