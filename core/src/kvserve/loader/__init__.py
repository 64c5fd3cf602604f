"""Opening a model checkpoint: an HF-format directory, a GGUF file or the embedded default model.

Importing this package imports torch and transformers; the engine imports it when it starts.
"""

from kvserve.loader.open import open_model
from kvserve.loader.source import ModelLoadError, ModelSource

__all__ = ["ModelLoadError", "ModelSource", "open_model"]
