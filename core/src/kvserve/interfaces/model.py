"""The Model interface: a torch module built from an HF config that runs on the paged KV cache."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from kvserve.forward_context import ForwardContext
    from kvserve.interfaces.quantization import QuantizationMethod


@runtime_checkable
class Model(Protocol):
    """A ``torch.nn.Module`` registered under an HF ``architectures`` name.

    Build it with core layers (``kvserve.layers``): ``ColumnLinear`` / ``RowLinear`` /
    ``MergedColumnLinear`` (never slicing fused shards itself), ``RMSNorm`` (which takes the
    residual, ``hidden, residual = norm(hidden, residual)``, so a platform fuses the add; its
    ``add_and_norm`` where the stream starts at the first layer),
    ``RotaryEmbedding``, ``SiluAndMul`` and ``PagedAttention``, which calls the engine's attention
    backend; ``load_checkpoint`` loads the weight stream into them. A decoder-only causal LM
    of the Llama kind subclasses ``kvserve.layers.DecoderForCausalLM`` and states only its
    ``DecoderSpec`` (how it departs from the Llama layout).
    The engine constructs it on the target device with the default dtype already set.

    Tensor parallelism: a model class with ``supports_tensor_parallel = True`` is built on each
    rank with ``kvserve.distributed`` already set up; its core linear layers take their rank's
    slice (``QKVLinear`` for q/k/v heads), its attention layers and :meth:`attention_shape` state
    the rank's heads, its ``VocabEmbedding`` holds the rank's vocabulary shard (``forward``
    returns every token's embedding on every rank), and :meth:`compute_logits` (through
    ``VocabEmbedding.logits``) returns the full vocabulary on rank 0, whatever it returns on the
    other ranks being discarded. Without the attribute, ``tensor_parallel_size > 1`` is refused
    for the model.
    """

    def __init__(self, hf_config: Any, quant_method: QuantizationMethod) -> None:
        """Create the layers from ``hf_config`` (a ``transformers.PretrainedConfig``).

        ``quant_method`` creates and applies the weights of every linear layer.
        """

    def attention_shape(self) -> tuple[int, int, int, int]:
        """``(num_layers, num_heads, num_kv_heads, head_dim)`` of the KV cache this model needs
        (this tensor-parallel rank's heads)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors into the parameters (fusing shards as needed).

        Raises ``kvserve.errors.WeightLoadError`` naming any checkpoint tensor with no place in the model.
        """

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Hidden states ``[num_tokens, hidden]`` for the flattened tokens of one step."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Vocabulary logits ``[n, vocab]`` (float32) for selected hidden rows ``[n, hidden]`` (on
        rank 0 under tensor parallelism; other ranks may return their shard's)."""
