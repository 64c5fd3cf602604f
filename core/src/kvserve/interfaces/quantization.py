"""The QuantizationMethod interface: how a linear layer stores, loads and applies its weight."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from kvserve.interfaces.linear_kernel import LinearKernel
    from kvserve.interfaces.platform import Platform


@dataclass(frozen=True)
class ParamLoading:
    """How a checkpoint tensor of one shard lands in a (possibly fused) layer parameter.

    A fused layer (qkv, gate-up) stacks its shards along the output features; each parameter
    says where those run, so packed formats load into fused layers without a loader of their own.
    """

    output_dim: int | None = 0
    """The dimension the output features run along (AWQ's ``qweight [in, out/8]``: 1); ``None``
    when the parameter does not grow with the output features (see :attr:`per_shard`)."""
    packed_factor: int = 1
    """Output features per element along ``output_dim`` (8 for int4 packed into int32)."""
    per_shard: bool = False
    """One entry per shard along dim 0 (a per-tensor scale of each fused projection): shard ``i``
    loads its (one-element) tensor into index ``i``. Only with ``output_dim=None``."""
    optional: bool = False
    """The checkpoint may omit it (the value created stays)."""
    input_dim: int | None = None
    """The dimension the input features run along (a dense ``weight [out, in]``: 1; AWQ's
    ``qweight [in, out/8]``: 0), along which a row-parallel layer takes its rank's slice. ``None``
    with :attr:`input_replicated` false: the method cannot split the parameter by input features
    (loading it into a row-parallel layer of more than one rank is an error naming the method)."""
    input_group: int = 1
    """Input features per element along :attr:`input_dim` (AWQ's per-group ``scales [in/group,
    out]``: the group size): a rank's input slice must start and end on a group boundary."""
    input_replicated: bool = False
    """The parameter does not grow with the input features (a bias, a per-tensor or per-channel
    scale, a static activation scale): every row-parallel rank loads it whole."""
    shard_offsets: tuple[int, ...] | None = None
    """Where each shard starts along ``output_dim`` in elements, and where the last one ends, when
    shards pack at different rates (a GGUF keeps each fused shard's own block type, so a fused
    layer's bytes per output feature differ by shard): overrides the offsets ``output_sizes`` and
    :attr:`packed_factor` give. The offsets are the rank's (``create_weights`` gets the rank's
    sizes); such a parameter splits across tensor-parallel ranks only with :attr:`shard_groups`."""
    shard_groups: tuple[tuple[int, int], ...] | None = None
    """With :attr:`shard_offsets`, each shard's layout as ``(features, elements)``, which lets the
    loader split the parameter across tensor-parallel ranks: shard ``i``'s elements are its output
    features' rows one after another, each row its input features in groups of ``features`` held in
    ``elements`` consecutive elements (a GGUF Q8_0 shard: ``(32, 34)``, 32 weights in a 34-byte
    block; Q4_K: ``(256, 144)``; F16: ``(1, 2)``).

    The loader reads a checkpoint tensor of shard ``i`` (of any shape: a flat one too) as ``[rows,
    row_elements]``, the layer's ``full_output_sizes[i]`` rows of ``full_input_size / features *
    elements``, and copies into the shard's range, flat, the rows of a column-parallel rank's output
    features (``layer.shard_slices[i]``), or, in every row, the groups of a row-parallel rank's input
    features (``layer.input_slice``), which must start and end on the shard's group boundaries (a
    ``WeightLoadError`` otherwise; a method refuses such a split earlier, in ``create_weights``, with
    a ``ConfigError`` naming the layer and its format). So the shard's offsets span ``rank rows *
    rank input features / features * elements``. ``None``: a :attr:`shard_offsets` parameter loads
    only without tensor parallelism (an error naming the method otherwise)."""

    def __post_init__(self) -> None:
        if self.shard_groups is not None:
            if self.shard_offsets is None or len(self.shard_groups) != len(self.shard_offsets) - 1:
                raise ValueError("ParamLoading.shard_groups needs shard_offsets, one (features, elements) per shard")
            if any(features < 1 or elements < 1 for features, elements in self.shard_groups):
                raise ValueError(f"ParamLoading.shard_groups: {self.shard_groups} holds a size below 1")


class QuantizationMethod(ABC):
    """Creates, loads, post-processes and applies the weights of a ``kvserve.layers`` linear layer.

    Chosen from the checkpoint's ``quantization_config["quant_method"]`` or the config's
    ``quantization`` field; one instance serves every linear layer of a model, so per-layer
    state lives on the layer, never on the method.
    """

    name: str
    activation_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    """Activation (model) dtypes :meth:`apply` runs; ``dtype="auto"`` picks the platform's
    preferred dtype among these."""

    def __init__(self, quant_config: dict[str, Any] | None = None) -> None:
        """``quant_config`` is the checkpoint's ``quantization_config`` (None when not quantized).

        Raise ``kvserve.errors.ConfigError`` naming the field for a config this method cannot
        run (e.g. an unsupported bit width): it is called when the engine starts.
        """
        self.quant_config = quant_config or {}

    def unsupported_reasons(self, platform: Platform, dtype: torch.dtype) -> list[str]:
        """Why this method cannot run on ``platform`` with activations of ``dtype`` (empty: it can).

        The default refuses dtypes outside :attr:`activation_dtypes`.
        """
        name = str(dtype).removeprefix("torch.")
        if name not in self.activation_dtypes:
            return [f"activation dtype {name} is not supported (supported: {', '.join(self.activation_dtypes)})"]
        return []

    def ignored_prefixes(self) -> list[str]:
        """Checkpoint module names (``model.layers.0.mlp.down_proj``) left unquantized; an entry
        starting with ``re:`` is a regular expression matched against the whole name."""
        return []

    def is_ignored(self, prefix: str) -> bool:
        """Whether the layer with checkpoint name ``prefix`` stays unquantized (dense weights)."""
        for entry in self.ignored_prefixes():
            if entry.startswith("re:"):
                if re.fullmatch(entry[3:], prefix):
                    return True
            elif prefix == entry or prefix.endswith("." + entry):
                return True
        return False

    @abstractmethod
    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size: int,
        output_sizes: list[int],
        params_dtype: torch.dtype,
        prefix: str,
    ) -> None:
        """Register, with ``layer.add_param(name, tensor, loading)``, the parameters the checkpoint
        holds for one linear layer, under their checkpoint names (``weight``, ``qweight``...).

        ``output_sizes`` are the output features of each fused shard (one entry for a plain
        layer); their sum is the layer's output size. ``params_dtype`` is the model dtype,
        ``prefix`` the layer's module name. The bias is the layer's own, not the method's.

        Under tensor parallelism both sizes are this rank's: a column layer's ``output_sizes`` are
        its slice of each shard (``layer.shard_slices``), a row layer's ``input_size`` its slice of
        the input features (``layer.input_slice = (offset, size)`` in the checkpoint's features;
        ``None`` outside a row-parallel layer). The loader cuts each checkpoint tensor to the rank's
        part along the dims the ``ParamLoading`` names, so a method that can run a row-parallel
        layer declares ``input_dim`` (or ``input_replicated``) on every parameter, and raises
        ``kvserve.errors.ConfigError`` naming the layer when the rank's slice cannot be split
        (e.g. it does not fall on the format's group boundaries).
        """

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:  # noqa: B027 - optional hook
        """Repack loaded parameters into the form :meth:`apply` uses (optional); runs once per layer."""

    def use_linear_kernel(self, layer: torch.nn.Module, kernel: LinearKernel) -> bool:
        """Move a loaded layer onto the platform's ``kernel`` where it runs this format
        (``kernel.pack_quantized``), returning whether it did; the default (False) leaves the layer
        on :meth:`apply`'s own path.

        Called once per layer after :meth:`process_weights_after_loading`, only where the platform
        offers a :class:`LinearKernel`; the method then chooses per layer (shape, dtype) and keeps
        its own path for what the kernel refuses.
        """
        return False

    def keeps_embedding(self, prefix: str) -> bool:
        """Whether the vocabulary embedding with checkpoint module name ``prefix`` (``model.embed_tokens``,
        an untied ``lm_head``) keeps this method's format instead of dense model-dtype rows.

        Where it does, the embedding holds its ``[vocab, hidden]`` matrix as a one-shard linear layer
        of this method (made by :meth:`create_weights` under ``prefix``, so the checkpoint's tensor
        loads as a linear layer's does): the LM head's logits are :meth:`apply` on it and a lookup is
        :meth:`embedding`. Under tensor parallelism the embedding is vocab-parallel and the layer is
        column-parallel: ``output_sizes`` is this rank's rows of the vocabulary (``layer.shard_slices
        == [(vocab_start, rows)]``; padding past the vocabulary is core's, never the method's), and
        the loader cuts the checkpoint's matrix to them as it does any column layer's. Asked on every
        rank holding vocabulary rows; the default (False) keeps the embedding dense.
        """
        return False

    def embedding(self, layer: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """The rows ``[*ids.shape, in_features]`` of ``ids`` (int64, any shape) of the ``[vocab, hidden]``
        matrix ``layer`` holds in this method's format, in ``layer.params_dtype``: an embedding lookup.
        Under tensor parallelism ``layer`` holds a rank's rows and ``ids`` index them (``0 <= id <
        layer.output_size``); core masks and sums the other ranks' ids.

        Called only on an embedding :meth:`keeps_embedding` kept; a method that keeps one implements it.
        """
        raise NotImplementedError(f"quantization method {self.name!r} keeps an embedding but cannot look rows up")

    @abstractmethod
    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` for ``x`` of shape ``[..., input_size]``, in ``x``'s dtype."""
