"""What ``LLM.generate`` returns, shaped like vLLM's outputs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    """``"stop"`` (EOS or a stop token), ``"length"`` (max_tokens / max_model_len) or ``"abort"``."""
    stop_reason: int | str | None = None
    """The stop token id that ended generation, if any."""


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
