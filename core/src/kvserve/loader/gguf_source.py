"""GGUF files (llama.cpp): tensors under their HF names, with llama.cpp's changes undone.

Opened, a GGUF declares itself quantized (``hf_config.quantization_config``, ``quant_method``
``"gguf"``, with each linear weight's GGML type), so ``quantization="auto"`` keeps the linear
layers in the file's blocks where the ``gguf`` method is installed; ``quantization="none"``
dequantizes every tensor to float32 while streaming.

The file's header is parsed once (:mod:`kvserve.loader.gguf_file`): transformers builds the config
and the tokenizer from that parse, and the weights stream from its memory map.

What differs between architectures (q/k row order, constants folded into weights, config the
transformers GGUF reader drops) comes from the model plugins: ``register_gguf_architectures``."""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from kvserve.errors import UnknownComponentError
from kvserve.interfaces.gguf_architecture import GGUFArchitecture
from kvserve.loader.gguf_file import GGUFFile, transformers_reads_parsed
from kvserve.loader.source import ModelLoadError, ModelSource
from kvserve.loader.tokenizer import load_tokenizer, tokenizer_load_error
from kvserve.plugins import get_plugin_manager, load_component

KIND = "gguf_architecture"

# Tensors llama.cpp precomputes from the config; HF models derive them and store nothing.
DERIVED_TENSORS = {"rope_freqs.weight"}
QUANT_METHOD = "gguf"
"""The ``quant_method`` a GGUF's ``quantization_config`` names."""
PACKED_PARAM = "qweight"
"""The parameter under which a layer that keeps GGML blocks takes them (a flat uint8 tensor)."""


@dataclass
class GGUFSource(ModelSource):
    """A GGUF file; tensors are dequantized to float32 one at a time while streaming."""

    architecture: str
    """The GGUF ``general.architecture``."""
    fixups: GGUFArchitecture = field(repr=False)
    """The fix-ups of that architecture, from the model plugin that registered it."""
    file: GGUFFile = field(repr=False)
    """The file's one parse, kept open (memory-mapped): the weights stream from it."""
    hf_names: dict[str, str] = field(repr=False)
    """GGUF tensor name -> HF parameter name."""

    @property
    def num_tensors(self) -> int:
        """How many tensors :meth:`weights` yields (for progress bars)."""
        return sum(tensor.name not in DERIVED_TENSORS for tensor in self.file.tensors)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield float32 tensors under HF names, as the architecture's fix-ups restore them."""
        return self.weights_for(())

    def weights_for(self, takes: Container[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield the tensors under HF names, as the architecture's fix-ups restore them: a weight
        whose layer takes ``<module>.qweight`` as its GGML blocks (the file's bytes, a flat uint8
        tensor, rows reordered by the fix-ups where llama.cpp reordered them), any other dequantized
        to float32."""
        for tensor in self.file.tensors:
            if tensor.name in DERIVED_TENSORS:
                continue
            hf_name = self.hf_names.get(tensor.name)
            if hf_name is None:
                raise ModelLoadError(f"{self.path}: GGUF tensor {tensor.name!r} has no HF parameter name")
            module, _, suffix = hf_name.rpartition(".")
            packed_name = f"{module}.{PACKED_PARAM}"
            if suffix == "weight" and packed_name in takes:
                rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
                # One copy out of the read-only memory map; the rows are fixed up as raw bytes.
                blocks = torch.from_numpy(np.array(tensor.data).view(np.uint8).reshape(rows, -1))
                yield packed_name, self._fix(tensor.name, hf_name, blocks).reshape(-1)
                continue
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            # F32 tensors come back as views of the read-only memory map; torch needs writable memory.
            weight = torch.from_numpy(array if array.flags.writeable else array.copy())
            yield hf_name, self._fix(tensor.name, hf_name, weight)

    def _fix(self, gguf_name: str, hf_name: str, weight: torch.Tensor) -> torch.Tensor:
        try:
            return self.fixups.fix_tensor(hf_name, weight, self.hf_config)
        except ValueError as error:
            raise ModelLoadError(f"{self.path}: GGUF tensor {gguf_name!r}: {error}") from error


def open_gguf(file: Path, tokenizer: str | None = None) -> GGUFSource:
    """Open a GGUF file: config and tokenizer through transformers' GGUF support, weights by streaming;
    the file's header is parsed once (:mod:`kvserve.loader.gguf_file`) for all three."""
    parsed = GGUFFile(file)
    architecture = parsed.value("general.architecture")
    fixups = gguf_architecture(architecture, file)
    with transformers_reads_parsed(parsed):
        hf_config = AutoConfig.from_pretrained(file.parent, gguf_file=file.name)
    if not hf_config.architectures:
        # GGUF metadata has no HF class name; the engine picks the model class by it.
        hf_config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[hf_config.model_type]]
    head_dim = parsed.value(f"{architecture}.attention.key_length")
    if head_dim is not None:
        # transformers' GGUF config mapping drops key_length and falls back to a default
        # (hidden/heads, or Qwen3's 128), wrong for models whose head_dim is set explicitly.
        hf_config.head_dim = head_dim
    try:
        fixups.fix_config(parsed.value, hf_config)
    except ValueError as error:
        raise ModelLoadError(f"{file}: {error}") from error
    hf_names = hf_names_by_gguf_name(hf_config, architecture, fixups)
    hf_config.quantization_config = gguf_quantization_config(parsed, hf_names)
    if tokenizer is None:
        with transformers_reads_parsed(parsed):
            hf_tokenizer = gguf_tokenizer(file, hf_config)
    else:
        hf_tokenizer = load_tokenizer(tokenizer)
    return GGUFSource(
        hf_config=hf_config,
        tokenizer=hf_tokenizer,
        path=str(file),
        architecture=architecture,
        fixups=fixups,
        file=parsed,
        hf_names=hf_names,
    )


def gguf_tokenizer(file: Path, hf_config: transformers.PretrainedConfig) -> transformers.PreTrainedTokenizerBase:
    """The tokenizer ``AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)`` builds, for the
    ``hf_config`` already read from ``file``; a ModelLoadError naming the file when it cannot be built.

    Given ``gguf_file``, transformers reads the metadata twice more, once through its slow reader only
    to rebuild the config. Here its fast reader reads the vocabulary once (:func:`open_gguf` hands it
    its own parse instead), transformers converts it, and ``AutoTokenizer`` picks the tokenizer class
    from the config it is given."""
    try:
        architecture, tokenizer_dict, tokenizer_kwargs = get_gguf_tokenizer(str(file))
        backend, converter_kwargs = convert_gguf_tokenizer(architecture, tokenizer_dict)
        return AutoTokenizer.from_pretrained(
            str(file.parent), config=hf_config, tokenizer_object=backend, **{**tokenizer_kwargs, **converter_kwargs}
        )
    except (OSError, ValueError) as error:
        raise tokenizer_load_error(file, error) from error


def gguf_quantization_config(file: GGUFFile, hf_names: dict[str, str]) -> dict:
    """The file's ``quantization_config``: the GGML type name of every 2-D weight by HF module name
    (``tensor_types``), how many files the model is split into (``split_count``), and
    ``dequantizable``: without the ``gguf`` method installed, ``quantization="auto"`` dequantizes."""
    types = {}
    for tensor in file.tensors:
        hf_name = hf_names.get(tensor.name, "")
        if hf_name.endswith(".weight") and len(tensor.shape) == 2:
            types[hf_name.removesuffix(".weight")] = tensor.tensor_type.name
    split_count = file.value("split.count") or 1
    return {"quant_method": QUANT_METHOD, "tensor_types": types, "split_count": split_count, "dequantizable": True}


def gguf_architecture(architecture: str, file: Path) -> GGUFArchitecture:
    """The fix-ups an installed model plugin registered for ``architecture``; a ModelLoadError naming
    the architectures installed plugins read (and their packages) when none did."""
    manager = get_plugin_manager()
    try:
        return load_component(KIND, architecture)()
    except UnknownComponentError as error:
        entries = manager.registry(KIND).entries()
        readable = ", ".join(sorted(f"{reg.name} ({reg.package})" for reg in entries if reg.problem is None))
        failed = manager.failed_plugins()
        raise ModelLoadError(
            f"{file}: GGUF architecture {architecture!r} is not supported by the installed model plugins "
            f"(they read: {readable or 'none'}); install a model plugin that registers it "
            f"(hook register_gguf_architectures)" + (f"; plugins that failed to load: {failed}" if failed else "")
        ) from error


def hf_names_by_gguf_name(
    hf_config: transformers.PretrainedConfig, architecture: str, fixups: GGUFArchitecture
) -> dict[str, str]:
    """Map GGUF tensor names (``blk.0.attn_q.weight``) to HF parameter names.

    gguf's ``TensorNameMap`` maps HF names to GGUF names; it is inverted over the parameter names of
    the model for this config (:func:`parameter_names`)."""
    arch = next(key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture)
    name_map = gguf.get_tensor_name_map(arch, hf_config.num_hidden_layers)
    names = {}
    for hf_name in parameter_names(hf_config, fixups):
        module_name, _, suffix = hf_name.rpartition(".")
        gguf_name = name_map.get_name(module_name)
        if gguf_name is not None:
            names[f"{gguf_name}.{suffix}"] = hf_name
    return names


def parameter_names(hf_config: transformers.PretrainedConfig, fixups: GGUFArchitecture) -> list[str]:
    """The HF parameter names of the model for ``hf_config``, built on the meta device (no memory, no
    init): the model plugin's model's checkpoint names where the architecture says they are HF's
    (``GGUFArchitecture.model_has_hf_names``), else transformers' model's."""
    if fixups.model_has_hf_names:
        from kvserve.layers import UnquantizedLinearMethod
        from kvserve.layers.loading import checkpoint_targets

        with torch.device("meta"):
            model = load_component("model", hf_config.architectures[0])(hf_config, UnquantizedLinearMethod())
        return list(checkpoint_targets(model))
    with torch.device("meta"):
        return list(AutoModelForCausalLM.from_config(hf_config).state_dict())
