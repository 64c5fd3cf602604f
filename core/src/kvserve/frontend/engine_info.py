"""What the frontend (the server, AsyncLLM) needs to know of the engine, wherever the engine runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvserve.config import StructuredOutputsConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.validation import CheckedRequest, check_request
from kvserve.interfaces.logits_processor import LogitsProcessor
from kvserve.lora.request import LoRARequest
from kvserve.lora.tokenizer import AdapterTokenizers
from kvserve.sampling_params import SamplingParams


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
    logits_processors: tuple[type[LogitsProcessor], ...] = ()
    """The engine's batch-level logits processor classes (they validate each request's params)."""
    structured_outputs: StructuredOutputsConfig = field(default_factory=StructuredOutputsConfig)
    """The engine's ``structured_outputs_config`` (which backends may compile a request's constraint)."""
    default_sampling_fields: dict[str, Any] = field(default_factory=dict)
    """SamplingParams fields a request that leaves them unset gets (``LLMEngine.default_sampling_fields``)."""
    enable_lora: bool = False
    """Whether requests may name a LoRA adapter."""
    tokenizers: AdapterTokenizers | None = field(default=None, repr=False, compare=False)
    """Each request's tokenizer: its adapter's own where the adapter ships one, else :attr:`tokenizer`
    (the engine's own cache when it runs in this process; None: a new one)."""

    def __post_init__(self) -> None:
        if self.tokenizers is None:
            object.__setattr__(self, "tokenizers", AdapterTokenizers(self.tokenizer, self.enable_lora))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> EngineInfo:
        return cls(
            model_path=str(engine.model_path),
            max_model_len=engine.max_model_len,
            vocab_size=engine.hf_config.vocab_size,
            max_n=engine.config.scheduler.max_n,
            tokenizer=engine.tokenizer,
            logits_processors=tuple(engine.logits_processor_classes),
            structured_outputs=engine.config.decoding.structured_outputs_config,
            default_sampling_fields=dict(engine.default_sampling_fields),
            enable_lora=engine.config.lora.enable_lora,
            tokenizers=engine.tokenizers,
        )

    def check_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> CheckedRequest:
        """:func:`~kvserve.engine.validation.check_request` against this engine's limits and its
        batch-level logits processors."""
        return check_request(
            prompt_token_ids, params, vocab_size=self.vocab_size, max_model_len=self.max_model_len,
            max_n=self.max_n, tokenizer=self.tokenizers.of(lora_request), logits_processors=self.logits_processors,
            structured_outputs=self.structured_outputs, prompt=prompt, priority=priority, cache_salt=cache_salt,
            lora_request=lora_request, enable_lora=self.enable_lora,
        )  # fmt: skip
