"""GGUF files (llama.cpp): dequantized tensors under their HF names, with llama.cpp's reordering undone."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from kvserve.loader.source import ModelLoadError, ModelSource
from kvserve.loader.tokenizer import load_tokenizer

# GGUF architecture -> whether llama.cpp's converter permuted the q/k projection rows.
# (convert_hf_to_gguf.py reorders them for its rope kernel on "llama", which also covers Mistral.)
SUPPORTED_ARCHITECTURES = {"llama": True, "qwen2": False, "qwen3": False, "gemma2": False, "gemma3": False}

# Architectures whose RMSNorm gains llama.cpp stores as ``1 + weight`` (its kernel has no offset;
# HF's Gemma RMSNorm multiplies by ``1 + weight``), for every tensor named ``*norm.weight``.
NORM_SHIFTED_ARCHITECTURES = {"gemma2", "gemma3"}

# Tensors llama.cpp precomputes from the config; HF models derive them and store nothing.
DERIVED_TENSORS = {"rope_freqs.weight"}


@dataclass
class GGUFSource(ModelSource):
    """A GGUF file; tensors are dequantized to float32 one at a time while streaming."""

    architecture: str
    """The GGUF ``general.architecture`` (a key of :data:`SUPPORTED_ARCHITECTURES`)."""
    reader: gguf.GGUFReader = field(repr=False)
    """Kept open (memory-mapped): parsing a GGUF's metadata takes seconds."""

    @property
    def num_tensors(self) -> int:
        """How many tensors :meth:`weights` yields (for progress bars)."""
        return sum(tensor.name not in DERIVED_TENSORS for tensor in self.reader.tensors)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield float32 tensors under HF names, q/k rows restored to HF order, Gemma norm gains unshifted."""
        hf_names = hf_names_by_gguf_name(self.hf_config, self.architecture)
        for tensor in self.reader.tensors:
            if tensor.name in DERIVED_TENSORS:
                continue
            hf_name = hf_names.get(tensor.name)
            if hf_name is None:
                raise ModelLoadError(f"{self.path}: GGUF tensor {tensor.name!r} has no HF parameter name")
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
            # F32 tensors come back as views of the read-only memory map; torch needs writable memory.
            weight = torch.from_numpy(array if array.flags.writeable else array.copy())
            if SUPPORTED_ARCHITECTURES[self.architecture]:
                weight = unpermute_qk(hf_name, weight, self.hf_config)
            if self.architecture in NORM_SHIFTED_ARCHITECTURES and tensor.name.endswith("norm.weight"):
                weight -= 1.0
            yield hf_name, weight


def open_gguf(file: Path, tokenizer: str | None = None) -> GGUFSource:
    """Open a GGUF file: config and tokenizer through transformers' GGUF support, weights by streaming."""
    reader = gguf.GGUFReader(file)
    architecture = metadata_value(reader, "general.architecture")
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{file}: GGUF architecture {architecture!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    hf_config = AutoConfig.from_pretrained(file.parent, gguf_file=file.name)
    if not hf_config.architectures:
        # GGUF metadata has no HF class name; the engine picks the model class by it.
        hf_config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[hf_config.model_type]]
    head_dim = metadata_value(reader, f"{architecture}.attention.key_length")
    if head_dim is not None:
        # transformers' GGUF config mapping drops key_length and falls back to a default
        # (hidden/heads, or Qwen3's 128), wrong for models whose head_dim is set explicitly.
        hf_config.head_dim = head_dim
    if architecture == "gemma3":
        apply_gemma3_rope_scaling(reader, hf_config, file)
    if tokenizer is None:
        hf_tokenizer = load_tokenizer(str(file.parent), gguf_file=file.name)
    else:
        hf_tokenizer = load_tokenizer(tokenizer)
    return GGUFSource(
        hf_config=hf_config, tokenizer=hf_tokenizer, path=str(file), architecture=architecture, reader=reader
    )


def metadata_value(reader: gguf.GGUFReader, key: str) -> str | int | float | None:
    """A scalar or string GGUF metadata value (``None`` when the key is absent)."""
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    return bytes(value).decode() if field.types[0] == gguf.GGUFValueType.STRING else value[0].item()


def apply_gemma3_rope_scaling(reader: gguf.GGUFReader, hf_config: transformers.PretrainedConfig, file: Path) -> None:
    """Put a Gemma 3 GGUF's rope scaling on the global layers, where HF applies it.

    llama.cpp writes the linear scaling of Gemma 3 4B and larger (factor 8) as
    ``gemma3.rope.scaling.*``; transformers' GGUF config mapping drops it. Local layers are never scaled.
    """
    kind = metadata_value(reader, "gemma3.rope.scaling.type")
    if kind in (None, "none"):
        return
    if kind != "linear":
        raise ModelLoadError(f"{file}: Gemma 3 rope scaling {kind!r} is not supported (only 'linear')")
    factor = float(metadata_value(reader, "gemma3.rope.scaling.factor"))
    full = hf_config.rope_parameters["full_attention"]
    hf_config.rope_parameters["full_attention"] = {**full, "rope_type": "linear", "factor": factor}


def hf_names_by_gguf_name(hf_config: transformers.PretrainedConfig, architecture: str) -> dict[str, str]:
    """Map GGUF tensor names (``blk.0.attn_q.weight``) to HF parameter names.

    gguf's ``TensorNameMap`` maps HF names to GGUF names; it is inverted over the parameter
    names of the HF model for this config, built on the meta device (no memory, no init).
    """
    arch = next(key for key, name in gguf.MODEL_ARCH_NAMES.items() if name == architecture)
    name_map = gguf.get_tensor_name_map(arch, hf_config.num_hidden_layers)
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(hf_config)
    names = {}
    for hf_name in hf_model.state_dict():
        module_name, _, suffix = hf_name.rpartition(".")
        gguf_name = name_map.get_name(module_name)
        if gguf_name is not None:
            names[f"{gguf_name}.{suffix}"] = hf_name
    return names


def unpermute_qk(hf_name: str, weight: torch.Tensor, hf_config: transformers.PretrainedConfig) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (weights and biases); other tensors pass through.

    llama.cpp stores each head's rows as interleaved (even, odd) rotary pairs; HF keeps the two
    halves of a head apart. The converter computes ``reshape(heads, 2, d/2, ...).swapaxes(1, 2)``.
    """
    if ".q_proj." in hf_name:
        heads = hf_config.num_attention_heads
    elif ".k_proj." in hf_name:
        heads = hf_config.num_key_value_heads
    else:
        return weight
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)
