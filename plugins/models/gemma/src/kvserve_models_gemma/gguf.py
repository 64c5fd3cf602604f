"""How llama.cpp's GGUF files of Gemma 2 and Gemma 3 map onto the HF checkpoints."""

from __future__ import annotations

import torch

from kvserve.interfaces import GGUFArchitecture, GGUFMetadata


class Gemma2GGUF(GGUFArchitecture):
    """``"gemma2"``: RMSNorm gains stored as ``1 + weight``, restored."""

    name = "gemma2"
    model_has_hf_names = True

    def fix_tensor(self, hf_name: str, weight: torch.Tensor, hf_config) -> torch.Tensor:
        """Subtract the 1 llama.cpp adds to every RMSNorm gain (its kernel has no offset; HF's Gemma
        RMSNorm multiplies by ``1 + weight``); other tensors pass through."""
        if hf_name.endswith("norm.weight"):
            weight -= 1.0
        return weight


class Gemma3GGUF(Gemma2GGUF):
    """``"gemma3"``: as Gemma 2, and the global layers' rope scaling put back into the config."""

    name = "gemma3"

    def fix_config(self, metadata: GGUFMetadata, hf_config) -> None:
        """Put a Gemma 3 GGUF's rope scaling on the global layers, where HF applies it.

        llama.cpp writes the linear scaling of Gemma 3 4B and larger (factor 8) as
        ``gemma3.rope.scaling.*``; transformers' GGUF config mapping drops it. Local layers are never scaled.
        """
        kind = metadata("gemma3.rope.scaling.type")
        if kind in (None, "none"):
            return
        if kind != "linear":
            raise ValueError(f"Gemma 3 rope scaling {kind!r} is not supported (only 'linear')")
        factor = float(metadata("gemma3.rope.scaling.factor"))
        full = hf_config.rope_parameters["full_attention"]
        hf_config.rope_parameters["full_attention"] = {**full, "rope_type": "linear", "factor": factor}
