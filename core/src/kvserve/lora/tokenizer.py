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


class AdapterTokenizers:
    """The tokenizer each request's text goes through (its prompt, its ``bad_words``, its output): the
    one its adapter ships, read once per adapter id, else ``base``, the model's. With LoRA off
    (``enabled`` false) always ``base``: a request naming an adapter is refused when it is checked."""

    def __init__(self, base: Any, enabled: bool) -> None:
        self.base = base
        self.enabled = enabled
        self._shipped: dict[int, Any] = {}  # adapter id -> its own tokenizer, or None: it ships none

    def of(self, lora_request: LoRARequest | None) -> Any:
        """``lora_request``'s tokenizer (the model's for None); ValueError naming the adapter when the
        tokenizer it ships cannot be read."""
        if lora_request is None or not self.enabled:
            return self.base
        key = lora_request.lora_int_id
        if key not in self._shipped:
            self._shipped[key] = adapter_tokenizer(lora_request)
        return self._shipped[key] or self.base

    def forget(self, lora_int_id: int) -> None:
        """Adapter ``lora_int_id`` was unloaded: a later one under that id is read afresh."""
        self._shipped.pop(lora_int_id, None)
