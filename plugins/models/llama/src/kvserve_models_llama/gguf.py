"""How llama.cpp's GGUF files of the Llama family map onto the HF checkpoints.

llama.cpp's converter (``convert_hf_to_gguf.py``) writes Llama and Mistral as ``"llama"``, reordering
the q/k projection rows for its rope kernel; Qwen2 and Qwen3 it writes as HF has them.
"""

from __future__ import annotations

import torch

from kvserve.interfaces import GGUFArchitecture


class LlamaGGUF(GGUFArchitecture):
    """``"llama"`` (Llama, Mistral): the q/k rows llama.cpp permuted, restored to HF order."""

    name = "llama"
    model_has_hf_names = True

    def fix_tensor(self, hf_name: str, weight: torch.Tensor, hf_config) -> torch.Tensor:
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


class Qwen2GGUF(GGUFArchitecture):
    """``"qwen2"``: written as HF has it."""

    name = "qwen2"
    model_has_hf_names = True


class Qwen3GGUF(GGUFArchitecture):
    """``"qwen3"``: written as HF has it."""

    name = "qwen3"
    model_has_hf_names = True
