"""Turning a conversation into prompt tokens with the tokenizer's own chat template (or one given instead)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvserve.errors import ConfigError


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered: no template, or the template rejected it."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param
        """The request field at fault."""


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: the template in a file, or the template itself (Jinja text); None: the tokenizer's."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    if "{{" in value or "{%" in value:
        return value
    raise ConfigError(f"chat_template: {value!r} is neither a file nor a Jinja template")


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    *,
    tools: list[dict[str, Any]] | None = None,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> tuple[str, list[int]]:
    """The templated prompt text and its token ids.

    ``chat_template`` replaces the tokenizer's; ``tools`` (OpenAI's tool definitions) is the template's
    ``tools`` variable; ``template_kwargs`` are more variables (a request's ``chat_template_kwargs``,
    e.g. Qwen3's ``enable_thinking``): a name that is an argument of ``apply_chat_template`` itself is
    refused. The template already writes any BOS token, so the text is encoded without adding
    special tokens again (as ``LLM.chat`` and vLLM do).
    """
    if not (chat_template or getattr(tokenizer, "chat_template", None)):
        raise ChatTemplateError("the model's tokenizer has no chat template; use /v1/completions with a plain prompt")
    variables = dict(template_kwargs or {})
    arguments = inspect.signature(tokenizer.apply_chat_template).parameters
    reserved = sorted(name for name in variables if name in {"messages", "conversation"} or name in arguments)
    if reserved:
        why = f"{reserved[0]!r} is an argument of apply_chat_template, not a template variable"
        raise ChatTemplateError(f"chat_template_kwargs: {why}", param="chat_template_kwargs")
    try:
        text = tokenizer.apply_chat_template(
            messages,
            tools=tools,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **variables,
        )
    except Exception as exc:  # jinja2's errors, and a template's own (None + str, a missing key): its input is at fault
        if variables:
            raise ChatTemplateError(
                f"the chat template rejected the messages or chat_template_kwargs: {exc}", param="chat_template_kwargs"
            ) from None
        raise ChatTemplateError(f"the chat template rejected the messages: {exc}") from None
    return text, tokenizer.encode(text, add_special_tokens=False)
