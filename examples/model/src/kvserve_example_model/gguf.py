"""GPT-2's GGUF files (llama.cpp's ``"gpt2"`` architecture) read as the HF checkpoint.

The loader maps tensor names through gguf's own table; what is GPT-2's alone is that llama.cpp's
converter transposes the checkpoint's Conv1D weights (stored ``[in, out]``) to ``[out, in]``.
"""

from __future__ import annotations

import torch

from kvserve.interfaces import GGUFArchitecture
from kvserve_example_model.gpt2 import CONV1D


class GPT2GGUF(GGUFArchitecture):
    """``"gpt2"``: the Conv1D weights transposed back to the checkpoint's ``[in, out]``."""

    name = "gpt2"

    def fix_tensor(self, hf_name: str, weight: torch.Tensor, hf_config) -> torch.Tensor:
        """Transpose the Conv1D weights back; other tensors pass through."""
        return weight.T.contiguous() if hf_name.endswith(CONV1D) else weight
