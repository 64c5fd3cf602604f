"""The ToolParser interface: finds the tool calls a model wrote in its own format.

With ``tool_choice="auto"`` the model decides whether to call tools, and writes the calls in the
format it was trained on (Hermes' ``<tool_call>{...}</tool_call>``, Mistral's ``[TOOL_CALLS][...]``,
Python calls...). A tool parser, chosen by ``--tool-call-parser NAME``, separates that text into the
reply's ``content`` and its ``tool_calls``, once for a whole reply and delta by delta for a stream.

Core does the rest: one parser per choice of a request, call ids, OpenAI's wire format,
``parallel_tool_calls`` and ``finish_reason="tool_calls"``.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from kvserve.sampling_params import SamplingParams


@dataclass(frozen=True)
class FunctionCall:
    """One tool call of a whole reply."""

    name: str
    arguments: str
    """The arguments as JSON text (an object, as the model wrote it: clients ``json.loads`` it)."""


@dataclass(frozen=True)
class ExtractedToolCalls:
    """A whole reply split into its text and its tool calls."""

    content: str
    """The text outside the tool calls ("" when there is none)."""
    tool_calls: list[FunctionCall] = field(default_factory=list)


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of one tool call of a stream, as OpenAI streams them: the call's first delta carries its
    ``name`` (and maybe the start of its arguments), the later ones only pieces of ``arguments``, whose
    concatenation is the call's arguments. The server adds the call's id and ``type`` to the first."""

    index: int
    """The call's position in the reply: 0, 1, ... in the order the calls start."""
    name: str | None = None
    """Set on the call's first delta only."""
    arguments: str = ""


@dataclass(frozen=True)
class ToolParserDelta:
    """What one text delta of a stream adds to the reply: content and pieces of tool calls."""

    content: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)


class ToolParser(ABC):
    """Splits a model's reply into content and tool calls, in one model family's format.

    Built by the server for each choice of a chat request that may call tools, as
    ``cls(tokenizer, tools)``: ``tokenizer`` is the engine's HF tokenizer, ``tools`` the request's
    tool definitions in OpenAI's shape (``{"type": "function", "function": {"name", "description",
    "parameters"}}``). An instance parses one reply, so it may keep the state of a stream.

    The contract (``kvserve.testing.ToolParserContract`` checks it on canned replies):

    - :meth:`extract_tool_calls` of a whole reply and the deltas of
      :meth:`extract_tool_calls_streaming` plus :meth:`finish_streaming` over the same text, however it
      is cut into deltas (at any character, with empty deltas between), agree: the content deltas join
      into ``content``, and the tool-call deltas into the same calls with the same arguments;
    - a stream holds back only text that may still turn out to be part of a tool call (the start of a
      delimiter cut by a delta), and sends it once it knows;
    - it never raises on text a model may write: text that is not a well-formed call is content.
    """

    name: ClassVar[str]
    """The registry name (``--tool-call-parser``)."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]]) -> None:
        """A parser for one reply of a request with these ``tools``; a subclass that keeps stream state
        sets it up here, after ``super().__init__``."""
        self.tokenizer = tokenizer
        self.tools = tools

    def adjust_sampling_params(self, params: SamplingParams) -> SamplingParams:
        """The request's sampling params as this format needs them (default: unchanged). A format
        whose delimiter is a special token keeps special tokens in the text:
        ``params.model_copy(update={"skip_special_tokens": False})``."""
        return params

    def extract_tool_calls(self, text: str) -> ExtractedToolCalls:
        """``text``, a whole reply, as content and tool calls.

        The default streams ``text`` through a fresh parser in one delta; override it only where a
        whole reply can be parsed faster, and keep it equal to the stream.
        """
        stream = type(self)(self.tokenizer, self.tools)
        content: list[str] = []
        names: list[str] = []
        arguments: list[list[str]] = []
        for delta in (stream.extract_tool_calls_streaming(text), stream.finish_streaming()):
            content.append(delta.content)
            for call in delta.tool_calls:
                if call.name is not None:
                    names.append(call.name)
                    arguments.append([])
                arguments[call.index].append(call.arguments)
        calls = [FunctionCall(name, "".join(pieces)) for name, pieces in zip(names, arguments)]
        return ExtractedToolCalls("".join(content), calls)

    @abstractmethod
    def extract_tool_calls_streaming(self, delta_text: str) -> ToolParserDelta:
        """The content and tool-call deltas that ``delta_text``, the reply's next piece of text, makes
        certain. Text that may still be the start of a tool call (``"<tool_"``) is held back until a
        later delta or :meth:`finish_streaming` settles it."""

    def finish_streaming(self) -> ToolParserDelta:
        """The rest, once the reply has ended: held-back text that turned out to be content, the
        closing pieces of a call cut short. The default sends nothing more."""
        return ToolParserDelta()

    def make_tool_call_id(self) -> str:
        """A fresh id for a call of this reply (OpenAI's ``call_`` and 24 characters by default); a
        format whose chat template checks ids (Mistral: 9 alphanumerics) makes its own."""
        return f"call_{uuid.uuid4().hex[:24]}"
