"""Choosing how to open what the user named: an HF directory, a GGUF file or the embedded default."""

from __future__ import annotations

from pathlib import Path

from kvserve.loader.default_model import embedded_gguf_path
from kvserve.loader.gguf_source import open_gguf
from kvserve.loader.safetensors_source import open_hf_directory
from kvserve.loader.source import ModelLoadError, ModelSource


def open_model(model: str | None, tokenizer: str | None = None) -> ModelSource:
    """Open ``model``: an HF-format directory, a ``.gguf`` file, or ``None`` for the embedded default.

    ``tokenizer`` is a directory to load the tokenizer from instead of the model's own.
    Nothing is downloaded: ``model`` must be a local path.
    """
    if model is None:
        return open_gguf(embedded_gguf_path(), tokenizer)
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(
            f"model path {model!r} does not exist (give a local HF-format directory or a .gguf file; "
            "nothing is downloaded from a hub)"
        )
    if path.is_dir():
        return open_hf_directory(path, tokenizer)
    if path.suffix == ".gguf":
        return open_gguf(path, tokenizer)
    raise ModelLoadError(f"model path {model!r} is a file but not a .gguf file; give a directory or a .gguf file")
