"""The tokenizer an adapter directory may ship (as vLLM reads it): one trained with added tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvserve.lora.request import LoRARequest

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""Either of them in an adapter's directory means it ships a tokenizer."""


def adapter_tokenizer(lora_request: LoRARequest) -> Any | None:
    """The HF tokenizer in ``lora_request``'s directory; None when it ships none (the base model's applies).
    ValueError naming the adapter when the files are there but cannot be read."""
    folder = Path(lora_request.lora_path)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer  # only adapters that ship a tokenizer pay for the import

    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as exc:  # any reader failure is the adapter's: name it
        where = f"LoRA adapter {lora_request.lora_name!r} ({folder})"
        raise ValueError(f"{where}: cannot read its tokenizer: {exc}") from None
