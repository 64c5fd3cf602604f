"""The OpenAI wire format: request bodies (strict: no type coercion, no unknown fields) and responses.

Requests carry OpenAI's fields plus vLLM's sampling extensions (``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``ignore_eos``, ``stop_token_ids``, ``priority``, ...).
``null`` means "the default" everywhere, as the official clients send it. Integers lie within
int64 and floats are finite (else a 400 naming the field). OpenAI fields that do not change
what is generated (``user``, ``store``, ``metadata``, ...) are accepted and ignored; those that
would and that kvserve cannot honour (``suffix``, ``tools``, ``response_format`` other than
text, ...) are a 400 naming the field unless they ask for what kvserve does anyway.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from fastapi import Request
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    SerializeAsAny,
    ValidationError,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from kvserve.sampling_params import SamplingParams
from kvserve.server.errors import OpenAIError, invalid_value_error, request_shape_error

RequestModel = TypeVar("RequestModel", bound=BaseModel)


async def read_body(request: Request, model: type[RequestModel]) -> RequestModel:
    """Parse the JSON body strictly into ``model``: 400 if it is not JSON, 422 if it has the wrong shape."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise request_shape_error(exc) from None


def _prompt_shape(value: Any, handler: Any) -> Any:
    try:
        return handler(value)
    except ValidationError:
        raise PydanticCustomError(
            "prompt_type", "must be a string, a list of strings, a list of token ids or a list of token id lists"
        ) from None


def _integral_float(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


Integer = Annotated[int, BeforeValidator(_integral_float)]
"""An integer as JSON (and its schema) has it: ``2.0`` is one too, ``2.5`` and ``"2"`` are not."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Int64 = Annotated[Integer, Field(ge=INT64_MIN, le=INT64_MAX)]
"""An integer as vLLM and torch take it; Python's (and JSON's) are unbounded."""

PromptInput = Annotated[str | list[str] | list[Integer] | list[list[Integer]], WrapValidator(_prompt_shape)]


def unsupported(field: str, why: str) -> OpenAIError:
    """400 for an OpenAI field whose meaning kvserve cannot honour."""
    return OpenAIError(400, f"{field}: {why}", param=field, code="unsupported_field")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False
    """Send a last chunk, with empty ``choices``, that holds the usage of the whole request."""
    include_obfuscation: bool | None = None
    """Ignored: kvserve adds no obfuscation padding to stream chunks."""


class GenerationRequest(_Strict):
    """Fields both generation endpoints share."""

    model: str | None = None
    n: Int64 | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # OpenAI's fields that change nothing kvserve generates: accepted and ignored.
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # vLLM's extensions.
    top_k: Int64 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: Int64 | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[Integer] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    allowed_token_ids: list[Integer] | None = None
    bad_words: list[str] | None = None
    priority: Int64 = 0

    _SHARED: ClassVar[tuple[str, ...]] = (
        "n", "temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p",
        "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "include_stop_str_in_output",
        "skip_special_tokens", "allowed_token_ids", "bad_words",
    )  # fmt: skip

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check_supported(self) -> None:
        """Refuse (400) a field the endpoint accepts for OpenAI's sake but cannot honour as asked."""

    def logit_bias_ids(self) -> dict[int, float]:
        """``logit_bias`` keyed by token id (JSON keys are strings); keys that are not integers are a 400."""
        keys = (self.logit_bias or {}).keys()
        if not all(key.isascii() and key.removeprefix("-").isdigit() and len(key) <= 20 for key in keys):
            raise OpenAIError(400, "logit_bias: keys must be token ids", param="logit_bias")
        return {int(token): bias for token, bias in (self.logit_bias or {}).items()}

    def _sampling_params(self, renames: dict[str, str] | None = None, **fields: Any) -> SamplingParams:
        """SamplingParams from the shared fields (unless null) plus the endpoint's ``fields`` (even None:
        ``max_tokens=None`` means up to the context length); bad values are 400s."""
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(400, "stream_options: only allowed when stream is true", param="stream_options")
        values = {name: getattr(self, name) for name in self._SHARED if getattr(self, name) is not None}
        values.update(fields)
        if self.logit_bias:
            values["logit_bias"] = self.logit_bias_ids()
        try:
            # A streamed answer goes out token by token; a whole one needs only the final output (as vLLM's
            # FINAL_ONLY: no per-token hand-off to the event loop).
            return SamplingParams(**values, output_kind="delta" if self.stream else "final_only")
        except ValidationError as exc:
            raise invalid_value_error(exc, renames) from None


class CompletionRequest(GenerationRequest):
    prompt: PromptInput
    max_tokens: Int64 | None = 16
    echo: bool | None = False
    logprobs: Int64 | None = None
    """Top-N logprobs per token; with ``echo``, for the prompt tokens too."""
    best_of: Int64 | None = None
    """Only ``n`` (or omitted): kvserve returns every sequence it samples, it does not rank them."""
    suffix: str | None = None
    """Only empty (or omitted): insertion after the completion is not supported."""

    def check_supported(self) -> None:
        n = 1 if self.n is None else self.n
        if self.best_of is not None and self.best_of != n:
            raise unsupported("best_of", f"must equal n ({n}) or be omitted: kvserve returns every sequence it samples")
        if self.suffix:
            raise unsupported("suffix", "text after the completion (insertion) is not supported")

    def sampling_params(self) -> SamplingParams:
        prompt_logprobs = self.logprobs if self.echo else None
        return self._sampling_params(
            max_tokens=self.max_tokens, logprobs=self.logprobs, prompt_logprobs=prompt_logprobs
        )

    def prompts(self) -> list[str] | list[list[int]]:
        """One entry per prompt: text or token ids."""
        if isinstance(self.prompt, str) or (self.prompt and isinstance(self.prompt[0], int)):
            return [self.prompt]  # type: ignore[list-item]
        if not self.prompt:
            raise OpenAIError(400, "prompt: must not be empty", param="prompt")
        return self.prompt  # type: ignore[return-value]


class TextContent(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContent] | None = None
    name: str | None = None

    def template_input(self) -> dict[str, str]:
        """What the chat template sees: text parts joined, ``developer`` read as ``system``."""
        content = self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content or [])
        message = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        return message


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int64 | None = None
    max_completion_tokens: Int64 | None = None
    logprobs: bool | None = False
    top_logprobs: Int64 | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, JsonValue] | None = None
    """More variables for the chat template (vLLM's), e.g. Qwen3's ``{"enable_thinking": false}``."""
    # Ignored: without tools there are no calls to parallelize; a prediction only speeds up a reply.
    parallel_tool_calls: bool | None = None
    prediction: JsonValue = None
    # Accepted only where they ask for what kvserve does anyway (plain text, no tools); see check_supported.
    response_format: dict[str, JsonValue] | None = None
    tools: list[JsonValue] | None = None
    tool_choice: JsonValue = None
    functions: list[JsonValue] | None = None
    function_call: JsonValue = None
    modalities: list[str] | None = None
    audio: JsonValue = None
    reasoning_effort: JsonValue = None
    verbosity: JsonValue = None
    web_search_options: JsonValue = None

    def check_supported(self) -> None:
        if self.response_format is not None and self.response_format.get("type") != "text":
            why = "only {'type': 'text'}: structured output (json_object, json_schema) is not supported"
            raise unsupported("response_format", why)
        for field in ("tools", "functions"):
            if getattr(self, field):
                raise unsupported(field, "tool and function calling are not supported")
        for field in ("tool_choice", "function_call"):
            if getattr(self, field) not in (None, "none", "auto"):
                raise unsupported(field, "only 'none' or 'auto': tool and function calling are not supported")
        if self.modalities is not None and set(self.modalities) != {"text"}:
            raise unsupported("modalities", "only ['text'] is supported")
        for field in ("audio", "reasoning_effort", "verbosity", "web_search_options"):
            if getattr(self, field) is not None:
                raise unsupported(field, "not supported by kvserve")

    def sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIError(400, "top_logprobs: requires logprobs to be true", param="top_logprobs")
        max_field = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
        return self._sampling_params(
            renames={"max_tokens": max_field, "logprobs": "top_logprobs"},
            max_tokens=getattr(self, max_field),
            logprobs=(self.top_logprobs or 0) if self.logprobs else None,
        )


class TokenizeRequest(_Strict):
    """Exactly one of ``prompt`` (text) and ``messages`` (through the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[Integer]


# -- responses ------------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    """The legacy completions shape: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: SerializeAsAny[AssistantMessage]
    """A subclass's fields too (``reasoning_content`` with a reasoning parser)."""
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: SerializeAsAny[DeltaMessage]
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
