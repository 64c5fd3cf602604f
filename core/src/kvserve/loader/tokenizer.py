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
        raise ModelLoadError(
            f"cannot load a tokenizer from {location} ({error}); pass the tokenizer's directory explicitly"
        ) from error
