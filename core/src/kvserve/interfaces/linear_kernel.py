"""The LinearKernel interface: a platform's own matmul for dense weights it repacks once."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class LinearKernel(ABC):
    """``y = x W^T + b`` for unquantized weights, on a weight repacked once into the layout the
    platform's GEMM library reads fastest (oneDNN's blocked layout on CPUs, for instance).

    A platform offers one through :meth:`Platform.linear_kernel`. After the weights are loaded
    and every quantization method has post-processed its layers, the engine hands each dense
    linear layer's weight (and the LM head's) to :meth:`pack`; where a packed tensor comes back it
    takes the dense weight's place (the original is freed, so memory is not doubled) and the
    layer computes through :meth:`apply` from then on. Packing is a per-shape, per-dtype choice:
    :meth:`pack` returns ``None`` where the kernel does not beat ``torch.nn.functional.linear``.

    A kernel may also multiply weight-only quantized weights (:meth:`pack_quantized`): a
    quantization method that finds its format served there (``QuantizationMethod.use_linear_kernel``)
    keeps its layer's weight in that format and computes through :meth:`apply_quantized`.
    """

    ggml_types: frozenset[str] = frozenset()
    """GGML block types (gguf's names, e.g. ``"Q8_0"``) :meth:`apply_ggml` multiplies; empty (the
    default): none, and a GGUF's layers keep their quantization method's own path."""

    name: str
    """Short name for the start-up line and ``kvserve bench`` (e.g. ``"onednn"``), read after
    packing: a class attribute, or set per instance where it depends on what :meth:`pack` took."""

    @abstractmethod
    def pack(self, weight: torch.Tensor) -> torch.Tensor | None:
        """``weight`` (``[out_features, in_features]``, the model dtype, on the platform's device)
        in this kernel's layout, or ``None`` to leave the layer on ``F.linear``: a dtype, shape or
        device the kernel does not run, or does not run faster.

        Called once per layer, before any forward. The result must not share memory with
        ``weight`` (the caller frees it) and must keep ``weight``'s ``shape`` and ``dtype``.
        """

    @abstractmethod
    def apply(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` for ``x`` of shape ``[..., in_features]`` in ``x``'s dtype, where
        ``packed`` is what :meth:`pack` returned for ``W``; a new contiguous tensor on ``x``'s device.

        At compiled optimization levels this runs under ``torch.compile`` (``fullgraph``, the
        packed tensor a graph input): when ``torch.compiler.is_compiling()`` it must call only ops
        dynamo traces and inductor compiles, e.g. one opaque ``torch.library.custom_op`` with a
        fake implementation giving the output's shape."""

    def apply_logits(self, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        """The LM head's logits: float32 ``x @ W.T`` for ``x`` ``[..., in_features]``, where ``packed`` is
        what :meth:`pack` returned for ``W`` (no bias); exactly the values of ``apply(x, packed,
        None).float()`` (the product rounded to ``x``'s dtype, then widened), which the default
        computes. A kernel may write them as float32 itself, sparing the logits a second pass. Under
        ``torch.compile`` the same rule as :meth:`apply`."""
        return self.apply(x, packed, None).float()

    def fuses_gated(self, activation: str, packed: torch.Tensor) -> bool:
        """Whether :meth:`apply_gated` runs a gated MLP's ``activation`` (``"silu"``: SwiGLU,
        ``"gelu_tanh"``: GeGLU) for gate and up weights packed like ``packed`` (what :meth:`pack`
        returned for one of them). Asked once per MLP after packing; ``False`` (the default) keeps
        the MLP's two products and its activation apart."""
        return False

    def apply_gated(self, x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str) -> torch.Tensor:
        """``act(x @ G.T) * (x @ U.T)`` for ``x`` ``[..., in_features]``, where ``gate`` and ``up`` are what
        :meth:`pack` returned for ``G`` and ``U`` (one shape, no bias) and :meth:`fuses_gated` said yes;
        a new contiguous ``[..., out_features]`` tensor of ``x``'s dtype. The values must be those of
        :meth:`apply` on each, then the activation-and-multiply in the MLP's order (products rounded to
        ``x``'s dtype, the activation rounded before the multiply): only the memory traffic and the
        calls between them go. Under ``torch.compile`` the same rule as :meth:`apply`."""
        raise NotImplementedError(f"{type(self).__name__} fuses no gated MLP")

    def pack_quantized(self, weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """A weight-only quantized weight ``W = weight.float() * scale`` in this kernel's layout, for
        activations of ``dtype``; ``None`` (the default) where the kernel does not run ``weight``'s
        dtype, its shape or ``dtype`` activations, and the quantization method keeps its own path.

        ``weight`` is ``[out_features, in_features]`` in a narrow dtype (e.g. ``torch.float8_e4m3fn``)
        on the platform's device; ``scale`` is float32, one per tensor (``[]`` or ``[1]``) or one per
        output feature (``[out_features, 1]``). Called once per layer, before any forward; the result
        must not share memory with ``weight`` (the caller frees it) and must keep its ``shape`` and
        ``dtype``, so the layer holds the quantized bytes and no wider copy.
        """
        return None

    def apply_quantized(
        self, x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``x @ (W * scale).T + bias`` for ``x`` of shape ``[..., in_features]`` in the ``dtype``
        :meth:`pack_quantized` took, where ``packed`` is what it returned for ``W`` and ``scale`` the
        scale it was given; a new contiguous tensor of ``x``'s dtype. Under ``torch.compile`` the same
        rule as :meth:`apply`: one opaque op with a fake implementation."""
        raise NotImplementedError(f"{type(self).__name__} packs no quantized weights")

    def apply_ggml(self, x: torch.Tensor, blocks: torch.Tensor, parts: tuple[tuple[str, int], ...]) -> torch.Tensor:
        """``x @ W.T`` for rows ``x`` ``[M, in_features]`` and a layer's weight ``[out_features, in_features]``
        held as a GGUF holds it, in parts: ``parts`` are ``(ggml_type, out_features)`` in order (a fused
        layer's shards, each of a type in :attr:`ggml_types`), ``blocks`` the flat uint8 of their GGML blocks,
        part after part, row after row. A kernel may quantize 16-bit activations per block as llama.cpp
        does (integer dot products), so the result approximates the dequantized product; float32 rows it
        multiplies as they are by the dequantized float32 weight (the dequantized product up to the order
        of the sums). A new ``[M, sum of the parts' out_features]`` tensor in ``x``'s dtype; called once
        per layer and step, so it should cost one op (a compiled graph's one opaque op)."""
        raise NotImplementedError(f"{type(self).__name__} multiplies no GGML blocks")
