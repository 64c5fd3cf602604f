"""A conversation with tools as the chat template can take it.

A template that knows tools (it uses the variable ``tools``: Qwen, Llama 3.1+, Mistral, Hermes...)
gets them as transformers passes them, and assistant calls with their arguments as objects, as such
templates expect (OpenAI sends them as JSON text). A template that does not (SmolLM2, many base
chat templates) gets the documented fallback instead: the tool definitions in the system message,
and each assistant call written into its message's content as JSON.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.meta

TOOLS_HEADER = "You can call these functions (JSON schemas):"
"""How the fallback introduces the tool definitions in the system message."""


@lru_cache(maxsize=16)
def template_knows_tools(template: str) -> bool:
    """Whether the Jinja ``template`` reads the variable ``tools``."""
    environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"])
    try:
        return "tools" in jinja2.meta.find_undeclared_variables(environment.parse(template))
    except jinja2.TemplateSyntaxError:  # a tag of transformers' own (``generation``): read the text
        return re.search(r"\btools\b", template) is not None


def _arguments(text: str) -> Any:
    """A call's arguments as an object where they are JSON text of one, else the text."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def conversation_for_template(
    template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``messages`` (as :meth:`ChatMessage.template_input` gives them) and ``tools`` for ``template``:
    the tools to pass it, and the messages rewritten as described above."""
    if template_knows_tools(template):
        for message in messages:
            for call in message.get("tool_calls", ()):
                call["function"]["arguments"] = _arguments(call["function"]["arguments"])
        return messages, tools
    messages = [dict(message) for message in messages]
    for message in messages:
        calls = message.pop("tool_calls", None)
        if calls:
            written = json.dumps(
                [{"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])} for c in calls],
                ensure_ascii=False,
            )
            message["content"] = f"{message['content']}\n{written}" if message["content"] else written
    if tools:
        listing = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in tools)
        text = f"{TOOLS_HEADER}\n{listing}"
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{text}" if messages[0]["content"] else text
        else:
            messages.insert(0, {"role": "system", "content": text})
    return messages, None
