"""Loading the tokenizer that goes with a checkpoint, with an error that says where it looked."""

from __future__ import annotations

import transformers
from transformers import AutoTokenizer

from kvserve.loader.source import ModelLoadError


def load_tokenizer(location: str, gguf_file: str | None = None) -> transformers.PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(location)``; a failure names ``location`` and the way out."""
    try:
        return AutoTokenizer.from_pretrained(location, gguf_file=gguf_file)
    except (OSError, ValueError) as error:
        where = f"{location}/{gguf_file}" if gguf_file else location
        raise ModelLoadError(
            f"cannot load a tokenizer from {where} ({error}); pass the tokenizer's directory explicitly"
        ) from error
