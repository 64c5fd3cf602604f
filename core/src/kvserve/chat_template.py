"""Turning a conversation into prompt tokens with the tokenizer's own chat template."""

from __future__ import annotations

from typing import Any

import jinja2


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered: no template, or the template rejected it."""


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True
) -> tuple[str, list[int]]:
    """The templated prompt text and its token ids.

    The template already writes any BOS token, so the text is encoded without adding special
    tokens again (as ``LLM.chat`` and vLLM do).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError("the model's tokenizer has no chat template; use /v1/completions with a plain prompt")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template rejected the messages: {exc}") from None
    return text, tokenizer.encode(text, add_special_tokens=False)
