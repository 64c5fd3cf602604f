"""Loading the tokenizer that goes with a checkpoint, with an error that says where it looked."""

from __future__ import annotations

import transformers
from transformers import AutoTokenizer

from kvserve.loader.source import ModelLoadError


def load_tokenizer(location: str) -> transformers.PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(location)``; a failure names ``location`` and the way out."""
    try:
        return AutoTokenizer.from_pretrained(location)
    except (OSError, ValueError) as error:
        raise tokenizer_load_error(location, error) from error


def tokenizer_load_error(where: object, error: Exception) -> ModelLoadError:
    """The error of a tokenizer that could not be built from ``where``: what went wrong and the way out."""
    return ModelLoadError(f"cannot load a tokenizer from {where} ({error}); pass the tokenizer's directory explicitly")
