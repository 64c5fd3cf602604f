"""What an opened checkpoint offers the engine: its HF config, its tokenizer and a weight stream."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvserve.errors import KvserveError

if TYPE_CHECKING:
    import torch
    import transformers


class ModelLoadError(KvserveError, ValueError):
    """A checkpoint cannot be opened; the message names the path and what is missing or unsupported."""


@dataclass
class ModelSource(ABC):
    """An opened checkpoint. Weights are read only when :meth:`weights` is iterated."""

    hf_config: transformers.PretrainedConfig
    tokenizer: transformers.PreTrainedTokenizerBase
    path: str
    """The directory or file the weights come from."""

    @abstractmethod
    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(HF parameter name, tensor)`` pairs one at a time, as stored (no dtype cast)."""

    def weights_for(self, takes: Container[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """The weight stream for a model that takes the checkpoint names ``takes`` (its parameters'
        names as ``kvserve.layers.checkpoint_targets`` lists them): :meth:`weights` unless the
        source holds a quantized format that the model's quantization method reads as it is stored
        (a GGUF's GGML blocks, which it then yields under the name the method registered)."""
        return self.weights()
