"""The wire format of tool calling (OpenAI's): tool definitions, ``tool_choice``, the calls in assistant
messages and replies, and their stream deltas."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, JsonValue] | None = None
    """A JSON schema of the arguments (an object); None: any object."""
    strict: bool | None = None
    """Ignored: ``required`` and named ``tool_choice`` always hold the arguments to ``parameters``."""


class ChatTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """``{"type": "function", "function": {"name": ...}}``: call this function, with valid arguments."""

    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(_Strict):
    name: str
    arguments: str
    """JSON text."""


class ToolCall(_Strict):
    """A call in an assistant message: in the conversation a request sends, and in a reply."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """A piece of a streamed call: the first names it (with ``id`` and ``type``), the rest carry arguments."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall
