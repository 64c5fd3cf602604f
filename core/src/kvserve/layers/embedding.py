"""The token embedding matrix, also used as a (tied) LM head; vocab-parallel by rank.

Under tensor parallelism (``kvserve.distributed.world_size() > 1`` when the module is built)
each rank holds one contiguous shard of the vocabulary: the vocabulary is padded to a multiple
of :data:`VOCAB_PADDING` and split evenly (as vLLM's ``VocabParallelEmbedding``; rounded up for
a rank count that does not divide it), so rank ``r`` holds ids ``[r * shard_rows, (r + 1) *
shard_rows)``, its rows past the vocabulary zero. A
lookup embeds the ids of the rank's shard, zeros for the others, and sums over ranks (exact:
each row comes from one rank); the LM head computes the rank's logits and gathers them on
rank 0, where the padding columns are cut off. One rank holds the whole, unpadded matrix.

A quantization method may keep the matrix in its own format (``QuantizationMethod.keeps_embedding``):
a GGUF file's Q8_0 ``token_embd`` stays in its blocks, as vLLM's GGUF embedding does. Under tensor
parallelism it is vocab-parallel alike: each rank keeps its shard's real rows in that format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from kvserve import distributed
from kvserve.errors import WeightLoadError
from kvserve.layers.linear import LinearBase

if TYPE_CHECKING:
    from kvserve.interfaces.linear_kernel import LinearKernel
    from kvserve.interfaces.quantization import QuantizationMethod

VOCAB_PADDING = 64
"""Under tensor parallelism the vocabulary is padded to a multiple of this before it is split."""


class VocabEmbedding(torch.nn.Module):
    """A ``[vocab, hidden]`` matrix used as token embedding and/or as the LM head.

    ``weight`` is this rank's ``[shard_rows, hidden]`` shard: ids ``[vocab_start, vocab_start +
    shard_rows)``, of which the first ``real_rows`` are in the vocabulary (``shard_rows ==
    real_rows == vocab_size`` on one rank). It loads from the full checkpoint matrix with
    :meth:`load`.

    Where ``quant_method`` keeps the embedding ``prefix`` in its format, ``quantized`` holds this
    rank's shard instead, as a ``[hidden -> real_rows]`` column layer of that method named ``prefix``
    (its ``shard_slices`` is ``[(vocab_start, real_rows)]``, so the checkpoint's tensor loads into it
    cut to the shard's rows; the whole matrix on one rank), and ``weight`` is empty. A rank whose
    shard is all padding (``real_rows == 0``) keeps its dense zero rows.
    """

    def __init__(
        self, vocab_size: int, hidden_size: int, quant_method: QuantizationMethod | None = None, prefix: str = ""
    ) -> None:
        super().__init__()
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        ranks, rank = distributed.world_size(), distributed.rank()
        if ranks == 1:
            self.shard_rows = vocab_size
        else:
            padded = -(-vocab_size // VOCAB_PADDING) * VOCAB_PADDING
            self.shard_rows = -(-padded // ranks)
        self.vocab_start = rank * self.shard_rows
        self.real_rows = max(0, min(vocab_size - self.vocab_start, self.shard_rows))
        self.quantized: LinearBase | None = None
        if quant_method is not None and self.real_rows > 0 and quant_method.keeps_embedding(prefix):
            self.quantized = LinearBase(
                hidden_size, [self.real_rows], False, quant_method, prefix,
                shard_slices=[(self.vocab_start, self.real_rows)], full_output_sizes=[vocab_size],
            )  # fmt: skip
        # Left uninitialised: weight loading fills it, and random init of a large vocab is slow.
        weight = torch.empty(0 if self.quantized else self.shard_rows, hidden_size)
        weight[self.real_rows :] = 0  # padding rows: their logits are cut off, their ids never looked up
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.head_kernel: LinearKernel | None = None
        self.packed_head: torch.Tensor | None = None

    def load(self, tensor: torch.Tensor, name: str = "weight") -> None:
        """Copy this rank's rows of the full checkpoint matrix ``tensor [vocab, hidden]`` into
        ``weight``; ``name`` (the checkpoint tensor's) is for the error a wrong shape raises."""
        if tuple(tensor.shape) != (self.vocab_size, self.hidden_size):
            raise WeightLoadError(
                f"{name}: expected shape {(self.vocab_size, self.hidden_size)}, got {tuple(tensor.shape)}"
            )
        self.weight.data[: self.real_rows].copy_(tensor[self.vocab_start : self.vocab_start + self.real_rows])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows ``[*input_ids.shape, hidden]`` of ``input_ids`` (full-vocabulary ids), on
        every rank."""
        if distributed.world_size() == 1:
            return self._rows(input_ids)
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.real_rows)
        rows = self._rows(local.masked_fill(outside, 0))
        return distributed.all_reduce(rows.masked_fill_(outside.unsqueeze(-1), 0))

    def _rows(self, local_ids: torch.Tensor) -> torch.Tensor:
        """The rows of ids within this rank's shard."""
        if self.quantized is not None:
            return self.quantized.quant_method.embedding(self.quantized, local_ids)
        return F.embedding(local_ids, self.weight)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits ``hidden [n, hidden] @ W^T`` in ``hidden``'s dtype, widened to float32 where a
        kernel runs the head (:meth:`LinearKernel.apply_logits`): ``[n, vocab_size]`` on
        rank 0; every other rank gets its own shard's ``[n, shard_rows]`` (padding included), which
        its caller discards (only rank 0 returns logits)."""
        if self.quantized is not None:
            local = self.quantized(hidden)
            if self.real_rows < self.shard_rows:  # every rank gathers shard_rows columns
                local = F.pad(local, (0, self.shard_rows - self.real_rows))
        elif self.head_kernel is None:
            local = F.linear(hidden, self.weight)
        else:
            local = self.head_kernel.apply_logits(hidden, self.packed_head)
        if distributed.world_size() == 1:
            return local
        full = distributed.gather(local, dim=-1)
        return local if full is None else full[..., : self.vocab_size]

    def pack_head(self, kernel: LinearKernel, keep_embedding: bool) -> bool:
        """Compute :meth:`logits`' matmul with ``kernel`` on a packed copy of the weight, where
        ``kernel.pack`` takes it; returns whether it did.

        Without ``keep_embedding`` (an untied LM head, never asked to embed) the dense weight is
        freed and :meth:`forward` can no longer run. A :attr:`quantized` matrix stays as its method
        holds it (its method moves it onto the kernel as it does a linear layer's).
        """
        if self.quantized is not None:
            return False
        packed = kernel.pack(self.weight.data)
        if packed is None:
            return False
        self.head_kernel, self.packed_head = kernel, packed
        if not keep_embedding:
            self.weight = torch.nn.Parameter(self.weight.data.new_empty(0), requires_grad=False)
        return True


def projection_layers(model: torch.nn.Module) -> list[LinearBase]:
    """The model's linear layers in module (forward) order, but for the ones holding a vocabulary
    matrix (:attr:`VocabEmbedding.quantized`): the projections that LoRA adapts and that hold the
    checkpoint's linear weights."""
    held = {id(m.quantized) for m in model.modules() if isinstance(m, VocabEmbedding) and m.quantized is not None}
    return [m for m in model.modules() if isinstance(m, LinearBase) and id(m) not in held]
