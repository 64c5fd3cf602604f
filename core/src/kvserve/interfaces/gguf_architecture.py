"""The GGUFArchitecture interface: how one llama.cpp architecture's GGUF files map onto the HF checkpoint.

A GGUF file (llama.cpp) names its architecture in ``general.architecture`` and stores its tensors
under llama.cpp's names, sometimes rearranged by llama.cpp's converter for its own kernels (rows
reordered, constants folded into weights) and with config metadata transformers' GGUF reader does
not carry over. The loader does what every architecture shares (tensor names through gguf's own
name map, dequantization, ``head_dim``); the model plugin that implements the architecture
registers a :class:`GGUFArchitecture` that undoes the rest (``register_gguf_architectures``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

GGUFMetadata = Callable[[str], Any]
"""A GGUF metadata lookup: the scalar or string value of a key (``"gemma3.rope.scaling.type"``), None when absent."""


class GGUFArchitecture:
    """The fix-ups of one GGUF architecture; the base class is right for a file llama.cpp wrote as HF has it.

    Built with no arguments, once per opened file. Both methods raise ``ValueError`` for a file they
    cannot read (the loader reports it as a ``ModelLoadError`` naming the file).
    """

    name: ClassVar[str]
    """The registry name: the GGUF ``general.architecture`` (``"llama"``), a value of ``gguf.MODEL_ARCH_NAMES``
    (the loader maps tensor names with gguf's tensor name map of that architecture)."""
    model_has_hf_names: ClassVar[bool] = False
    """True where the model plugin's model of these files' config (registered under its ``architectures[0]``)
    keeps HF's module paths, so that its checkpoint names are the HF checkpoint's: the loader then maps
    the file's tensors onto the names of that model, built on the meta device, rather than those of
    transformers' model (whose modeling code takes about a second to import and build).
    ``GGUFArchitectureContract`` checks the two agree."""

    def fix_config(self, metadata: GGUFMetadata, hf_config: Any) -> None:
        """Amend ``hf_config`` (a ``transformers.PretrainedConfig`` read from the file by transformers)
        in place with what its GGUF config mapping drops. The base class changes nothing."""

    def fix_tensor(self, hf_name: str, weight: Any, hf_config: Any) -> Any:
        """The HF checkpoint's tensor ``hf_name`` from the dequantized float32 ``weight`` the file stores
        under its GGUF name: undo what llama.cpp's converter did to it (may modify ``weight`` in place
        and return it). The base class returns ``weight`` unchanged.

        A linear layer that keeps the file's GGML blocks (``quantization="gguf"``) gets its weight as
        raw bytes, uint8 ``[out_features, bytes_per_row]``: a fix-up of such a weight may only reorder
        its rows (any other change needs the dequantized values; raise ``ValueError`` for it)."""
        return weight
