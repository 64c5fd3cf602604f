"""The OpenAI wire format: request bodies (strict: no type coercion, no unknown fields) and responses.

Requests carry OpenAI's fields plus vLLM's sampling extensions (``top_k``, ``min_p``,
``repetition_penalty``, ``min_tokens``, ``ignore_eos``, ``stop_token_ids``, ``priority``, ...).
``null`` means "the default" everywhere, as the official clients send it. Integers lie within
int64 and floats are finite (else a 400 naming the field). OpenAI fields that do not change
what is generated (``user``, ``store``, ``metadata``, ...) are accepted and ignored; those that
would and that kvserve cannot honour (``suffix``, ``functions``, ...) are a 400 naming the field
unless they ask for what kvserve does anyway. Tool calling's fields are in
:mod:`kvserve.server.protocol_tools`.

A structured-output constraint comes in any of vLLM's spellings (see
:meth:`GenerationRequest.structured_outputs_params`): OpenAI's ``response_format``, vLLM's
``structured_outputs`` object, or its older ``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar`` and ``structural_tag`` fields; at most one per request.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, ClassVar, Literal, TypeVar, cast

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
from kvserve.server.errors import OpenAIError, field_error, invalid_value_error, request_shape_error
from kvserve.server.protocol_tools import ChatTool, DeltaToolCall, ToolCall, ToolChoice
from kvserve.structured_outputs import CONSTRAINT_KINDS, ConstraintKind, StructuredOutputsParams

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


class JsonSchemaFormat(_Strict):
    """OpenAI's ``response_format.json_schema``."""

    name: str
    description: str | None = None
    schema_: dict[str, JsonValue] = Field(alias="schema")
    strict: bool | None = None
    """Accepted either way: the grammar always holds the output to the whole schema."""


class TagStructure(_Strict):
    """One tagged part of vLLM's older ``structural_tag`` response format."""

    begin: str
    schema_: dict[str, JsonValue] | None = Field(None, alias="schema")
    end: str


class ResponseFormat(_Strict):
    """OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema``) and vLLM's ``structural_tag``
    (``format``, or the older ``structures`` and ``triggers``)."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: JsonValue = None
    structures: list[TagStructure] | None = None
    triggers: list[str] | None = None

    _PARTS: ClassVar[tuple[str, ...]] = ("json_schema", "format", "structures", "triggers")
    _SHAPES: ClassVar[dict[str, list[set[str]]]] = {
        "text": [set()], "json_object": [set()], "json_schema": [{"json_schema"}],
        "structural_tag": [{"format"}, {"structures", "triggers"}],
    }  # fmt: skip

    def constraint(self) -> tuple[str, ConstraintKind, Any] | None:
        """(where it is, as the client wrote it; its kind; its value), None for ``text``; fields that do not
        go with ``type`` are a 400."""
        given = {name for name in self._PARTS if getattr(self, name) is not None}
        shapes = self._SHAPES[self.type]
        if given not in shapes:
            takes = " or ".join(", ".join(sorted(shape)) or "no other field" for shape in shapes)
            raise OpenAIError(
                400, f"response_format: type {self.type!r} takes {takes}; got {', '.join(sorted(given)) or 'none'}",
                param="response_format", code="invalid_value",
            )  # fmt: skip
        if self.type == "json_schema":
            assert self.json_schema is not None
            return "response_format.json_schema.schema", "json", self.json_schema.schema_
        if self.type == "json_object":
            return "response_format", "json_object", True
        if self.type == "structural_tag":  # as vLLM hands it to the backend: the whole object as JSON text
            return "response_format", "structural_tag", self.model_dump_json(by_alias=True, exclude_none=True)
        return None


OLDER_CONSTRAINT_FIELDS: dict[str, ConstraintKind] = {
    "guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar",
    "structural_tag": "structural_tag",
}  # fmt: skip
"""vLLM's older top-level spellings of a constraint (deprecated there, accepted here)."""


def _constraint_kind(key: str) -> ConstraintKind | None:
    """The constraint a ``structured_outputs`` key sets, if any (``json_schema`` is ``json``'s Python name)."""
    kind = "json" if key == "json_schema" else key
    return cast(ConstraintKind, kind) if kind in CONSTRAINT_KINDS else None


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
    # Structured outputs, in each spelling vLLM accepts; see structured_outputs_params.
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, JsonValue] | None = None
    """vLLM's object: the fields of ``StructuredOutputsParams`` (checked when the request is converted)."""
    guided_json: dict[str, JsonValue] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structural_tag: str | None = None
    guided_whitespace_pattern: str | None = None
    """vLLM's older spelling of ``structured_outputs.whitespace_pattern``."""
    guided_decoding_backend: str | None = None
    """Only null: the server's ``structured_outputs_config`` chooses the backend for every request."""

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

    def _constraints(self) -> list[tuple[str, ConstraintKind, Any]]:
        """Every constraint the request sets: (where, as the client wrote it; its kind; its value)."""
        found = []
        if self.response_format is not None and (given := self.response_format.constraint()) is not None:
            found.append(given)
        for key, value in (self.structured_outputs or {}).items():
            kind = _constraint_kind(key)
            if kind is not None and value is not None and value is not False:
                found.append((f"structured_outputs.{key}", kind, value))
        for field, kind in OLDER_CONSTRAINT_FIELDS.items():
            if getattr(self, field) is not None:
                found.append((field, kind, getattr(self, field)))
        return found

    def constraint_renames(self) -> dict[str, str]:
        """``structured_outputs.<kind>`` (how the engine names the constraint in its errors) to the field the
        client set it in, where that differs (``guided_regex``, ``response_format...``)."""
        renames = {f"structured_outputs.{kind}": where for where, kind, _ in self._constraints()}
        return {name: where for name, where in renames.items() if name != where}

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The request's one constraint, wherever it was set, with ``structured_outputs``' options (as vLLM
        merges them: ``structured_outputs={"disable_any_whitespace": true}`` applies to a ``response_format``).

        400s naming the fields: two constraints; options but no constraint; a value
        ``StructuredOutputsParams`` refuses (an empty ``choice``, a ``json`` string that is not JSON, ...);
        ``guided_decoding_backend``. Whether the engine can compile the constraint is checked later,
        with the prompt (``check_request``), its errors renamed by :meth:`constraint_renames`.
        """
        if self.guided_decoding_backend is not None:
            why = "the backend is chosen for the whole server (--structured-outputs-config '{\"backend\": ...}')"
            raise unsupported("guided_decoding_backend", why)
        constraints = self._constraints()
        options = {k: v for k, v in (self.structured_outputs or {}).items() if _constraint_kind(k) is None}
        if self.guided_whitespace_pattern is not None:
            options.setdefault("whitespace_pattern", self.guided_whitespace_pattern)
        if len(constraints) > 1:
            fields = [where for where, _, _ in constraints]
            raise OpenAIError(
                400, f"{', '.join(fields)}: a request takes one structured-output constraint; got {len(fields)}",
                param=fields[0].split(".")[0], code="invalid_value",
            )  # fmt: skip
        if not constraints:
            if self.structured_outputs is None and self.guided_whitespace_pattern is None:
                return None
            field = "structured_outputs" if self.structured_outputs is not None else "guided_whitespace_pattern"
            kinds = ", ".join(CONSTRAINT_KINDS)
            raise OpenAIError(400, f"{field}: no constraint given (one of {kinds})", param=field, code="invalid_value")
        _, kind, value = constraints[0]
        try:
            return StructuredOutputsParams.model_validate({**options, kind: value}, strict=True)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            message = "unknown field" if err["type"] == "extra_forbidden" else str(err["msg"])
            if err["loc"]:  # a key of structured_outputs: unknown, or a value of the wrong type
                message = f"structured_outputs.{err['loc'][0]}: {message}"
            raise field_error(message.removeprefix("Value error, "), self.constraint_renames()) from None

    def _sampling_params(
        self, defaults: dict[str, Any], renames: dict[str, str] | None = None, **fields: Any
    ) -> SamplingParams:
        """SamplingParams from the shared fields (unless null) plus the endpoint's ``fields`` (even None:
        ``max_tokens=None`` means up to the context length); bad values are 400s.

        ``defaults`` (the model's generation config: ``EngineInfo.default_sampling_fields``) fill the
        fields the request leaves unset (omitted or null); their ``max_tokens`` caps the request's, as
        vLLM's server does with ``max_new_tokens``."""
        if self.stream_options is not None and not self.stream:
            raise OpenAIError(400, "stream_options: only allowed when stream is true", param="stream_options")
        values = {name: value for name, value in defaults.items() if name != "max_tokens"}
        values.update({name: getattr(self, name) for name in self._SHARED if getattr(self, name) is not None})
        values.update(fields)
        if defaults.get("max_tokens") is not None:
            values["max_tokens"] = min(t for t in (values.get("max_tokens"), defaults["max_tokens"]) if t is not None)
        if self.logit_bias:
            values["logit_bias"] = self.logit_bias_ids()
        values["structured_outputs"] = self.structured_outputs_params()
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

    def sampling_params(self, defaults: dict[str, Any]) -> SamplingParams:
        """The request's SamplingParams, ``defaults`` (the model's generation config) where it sets none."""
        prompt_logprobs = self.logprobs if self.echo else None
        return self._sampling_params(
            defaults, max_tokens=self.max_tokens, logprobs=self.logprobs, prompt_logprobs=prompt_logprobs
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
    tool_calls: list[ToolCall] | None = None
    """An assistant's calls."""
    tool_call_id: str | None = None
    """The call a ``tool`` message answers."""

    def template_input(self) -> dict[str, Any]:
        """What the chat template sees: text parts joined, ``developer`` read as ``system``, the calls
        as OpenAI sends them (see :func:`kvserve.tool_calling.template.conversation_for_template`)."""
        content = self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content or [])
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int64 | None = None
    max_completion_tokens: Int64 | None = None
    logprobs: bool | None = False
    top_logprobs: Int64 | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, JsonValue] | None = None
    """Extra variables for the chat template, e.g. Qwen3's ``{"enable_thinking": false}``."""
    # Tool calling: see kvserve.server.serving_tools.
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Ignored: a prediction only speeds up a reply.
    prediction: JsonValue = None
    # Accepted only where they ask for what kvserve does anyway; see check_supported.
    functions: list[JsonValue] | None = None
    function_call: JsonValue = None
    modalities: list[str] | None = None
    audio: JsonValue = None
    reasoning_effort: JsonValue = None
    verbosity: JsonValue = None
    web_search_options: JsonValue = None

    def check_supported(self) -> None:
        if self.functions:
            raise unsupported("functions", "the deprecated function calling is not supported: use tools")
        if self.function_call not in (None, "none", "auto"):
            raise unsupported("function_call", "only 'none' or 'auto': use tools and tool_choice")
        if self.modalities is not None and set(self.modalities) != {"text"}:
            raise unsupported("modalities", "only ['text'] is supported")
        for field in ("audio", "reasoning_effort", "verbosity", "web_search_options"):
            if getattr(self, field) is not None:
                raise unsupported(field, "not supported by kvserve")

    def sampling_params(self, defaults: dict[str, Any]) -> SamplingParams:
        """The request's SamplingParams, ``defaults`` (the model's generation config) where it sets none."""
        if self.top_logprobs is not None and not self.logprobs:
            raise OpenAIError(400, "top_logprobs: requires logprobs to be true", param="top_logprobs")
        max_field = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
        return self._sampling_params(
            defaults,
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


class LoadLoRAAdapterRequest(_Strict):
    """``POST /v1/load_lora_adapter``, as vLLM's."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRAAdapterRequest(_Strict):
    """``POST /v1/unload_lora_adapter``, as vLLM's."""

    lora_name: str = Field(min_length=1)


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
    content: str | None
    tool_calls: list[ToolCall] | None = None


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
    tool_calls: list[DeltaToolCall] | None = None


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
