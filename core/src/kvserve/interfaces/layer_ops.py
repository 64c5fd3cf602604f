"""The LayerOps interface: a platform's fused kernels for the small elementwise steps of a layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    import torch


class LayerOps(ABC):
    """RMSNorm (with the residual add fused in), SiLU-and-multiply and rotary embedding, as one call
    each instead of the handful of PyTorch ops each is otherwise.

    A platform offers them through :meth:`Platform.layer_ops`; after building the model the engine
    hands them to every core layer that computes with them (``RMSNorm``, ``RotaryEmbedding``,
    ``SiluAndMul``; see ``kvserve.layers.use_layer_ops``). Core's ``kvserve.layers.TorchLayerOps``
    is the reference: plain PyTorch in HF transformers' order of operations. An implementation must
    agree with it to float32 rounding, round to the input dtype where it does (bfloat16/float16
    inputs are computed in float32), accept the layouts it documents and raise a ``ValueError`` or
    ``RuntimeError`` naming the argument for anything else. A platform with kernels for only some
    ops subclasses ``TorchLayerOps`` and overrides those.

    Every op is out of place: inputs are never written, outputs are new contiguous tensors in the
    input's dtype on the input's device.
    """

    name: ClassVar[str]
    """Short name for the start-up line (e.g. ``"torch"``, ``"cpu-native"``)."""

    def describe(self) -> str:
        """What the start-up line says about these ops: the name, and where a platform fell back to
        core's, why."""
        return self.name

    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
        """RMSNorm over the last dimension of ``x`` (``[..., n]``; the last dimension contiguous,
        leading dimensions of any stride, e.g. per-head views ``[tokens, heads, head_dim]``).

        In float32: ``y = x * rsqrt(sum(x**2) / n + eps)``. With ``weight_offset == 0`` (Llama)
        ``y`` is cast to ``x.dtype`` and then multiplied by ``weight`` (``[n]``, ``x``'s dtype),
        rounding again; otherwise (Gemma) it is multiplied by ``weight_offset + weight`` in float32
        and cast once.
        """

    @abstractmethod
    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``s = residual + x`` (rounded to the dtype, as the unfused add is) and
        ``(rms_norm(s, weight, eps, weight_offset), s)``: the decoder layer's residual add and the
        next norm in one pass. ``x`` and ``residual``: the same shape ``[tokens, n]`` and dtype."""

    @abstractmethod
    def silu_and_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` for two tensors of one shape ``[..., d]`` and dtype (the SwiGLU
        activation), each product rounded to the dtype as the two unfused ops round. Halves of one
        fused ``[..., 2d]`` projection may be passed as views (row-strided, last dimension contiguous)."""

    @abstractmethod
    def rotary_embedding(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Neox-style rotary embedding of ``query`` (``[tokens, heads, head_dim]``) and ``key``
        (``[tokens, kv_heads, head_dim]``), each last dimension contiguous (views of a fused qkv
        projection are fine). ``positions``: int64 ``[tokens]``; ``cos``/``sin``: float32
        ``[max_position, head_dim // 2]`` tables. Per half ``x1, x2`` of each head vector, in float32:
        ``(x1 * cos - x2 * sin, x2 * cos + x1 * sin)``, cast to the input dtype."""
