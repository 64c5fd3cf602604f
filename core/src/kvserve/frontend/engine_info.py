"""What the frontend (the server, AsyncLLM) needs to know of the engine, wherever the engine runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvserve.engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class EngineInfo:
    """Start-up facts of a loaded engine: enough to tokenize, validate and describe requests
    without touching the engine (which may live in another process)."""

    model_path: str
    max_model_len: int
    vocab_size: int
    max_n: int
    tokenizer: Any
    """The engine's own tokenizer (pickled across when the engine core has its own process)."""

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> EngineInfo:
        return cls(
            model_path=str(engine.model_path),
            max_model_len=engine.max_model_len,
            vocab_size=engine.hf_config.vocab_size,
            max_n=engine.config.scheduler.max_n,
            tokenizer=engine.tokenizer,
        )
