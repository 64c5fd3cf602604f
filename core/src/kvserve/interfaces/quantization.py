"""The QuantizationMethod interface: how a linear layer stores and applies its weight."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class QuantizationMethod(ABC):
    """Creates, post-processes and applies the weights of ``kvserve.layers.QuantLinear``.

    Chosen from the checkpoint's ``quantization_config["quant_method"]`` or the config's
    ``quantization`` field; one instance serves every linear layer of a model.
    """

    name: str

    def __init__(self, quant_config: dict[str, Any] | None = None) -> None:
        """``quant_config`` is the checkpoint's ``quantization_config`` (None when not quantized)."""
        self.quant_config = quant_config or {}

    @abstractmethod
    def create_weights(self, layer: torch.nn.Module, in_features: int, out_features: int, bias: bool) -> None:
        """Register the parameters the checkpoint holds for this layer (HF names, e.g. ``weight``)."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:  # noqa: B027 - optional hook
        """Repack loaded parameters into the form :meth:`apply` uses (optional)."""

    @abstractmethod
    def apply(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b`` for ``x`` of shape ``[..., in_features]``."""
