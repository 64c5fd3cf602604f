"""The OpenAI wire format: request bodies (strict: no type coercion, no unknown fields) and responses.

Requests carry OpenAI's fields plus vLLM's sampling extensions (``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``ignore_eos``, ``stop_token_ids``, ``priority``, ...).
``null`` means "the default" everywhere, as the official clients send it.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WrapValidator
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


PromptInput = Annotated[str | list[str] | list[int] | list[list[int]], WrapValidator(_prompt_shape)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    """Send a last chunk, with empty ``choices``, that holds the usage of the whole request."""


class GenerationRequest(_Strict):
    """Fields both generation endpoints share."""

    model: str | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extensions.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    priority: int = 0

    _SHARED: ClassVar[tuple[str, ...]] = (
        "n", "temperature", "top_p", "stop", "seed", "presence_penalty", "frequency_penalty", "top_k", "min_p",
        "repetition_penalty", "min_tokens", "ignore_eos", "stop_token_ids", "include_stop_str_in_output",
        "skip_special_tokens", "allowed_token_ids", "bad_words",
    )  # fmt: skip

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _sampling_params(self, renames: dict[str, str] | None = None, **fields: Any) -> SamplingParams:
        """SamplingParams from the shared fields (unless null) plus the endpoint's ``fields`` (even None:
        ``max_tokens=None`` means up to the context length); bad values are 400s."""
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(400, "stream_options: only allowed when stream is true", param="stream_options")
        values = {name: getattr(self, name) for name in self._SHARED if getattr(self, name) is not None}
        values.update(fields)
        if self.logit_bias:
            try:
                values["logit_bias"] = {int(token): bias for token, bias in self.logit_bias.items()}
            except ValueError:
                raise OpenAIError(400, "logit_bias: keys must be token ids", param="logit_bias") from None
        try:
            return SamplingParams(**values, output_kind="delta")
        except ValidationError as exc:
            raise invalid_value_error(exc, renames) from None


class CompletionRequest(GenerationRequest):
    prompt: PromptInput
    max_tokens: int | None = 16
    echo: bool | None = False
    logprobs: int | None = None
    """Top-N logprobs per token; with ``echo``, for the prompt tokens too."""

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
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True

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
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


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
    message: AssistantMessage
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
    delta: DeltaMessage
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
