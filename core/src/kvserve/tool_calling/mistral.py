"""``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``, as Mistral 7B Instruct v0.3, Mixtral
8x22B and Mistral Nemo write calls (a JSON list after the ``[TOOL_CALLS]`` token)."""

from __future__ import annotations

import secrets
import string

from kvserve.tool_calling.base import JsonCallListParser

_ID_ALPHABET = string.ascii_letters + string.digits


class MistralToolParser(JsonCallListParser):
    """A JSON list of ``{"name", "arguments"}`` objects after ``[TOOL_CALLS]``; text before it is content.
    ``[TOOL_CALLS]`` is a special token, so the reply keeps special tokens; call ids are the 9
    alphanumerics Mistral's chat templates insist on."""

    name = "mistral"
    list_start = "[TOOL_CALLS]"

    def adjust_sampling_params(self, params):
        return params.model_copy(update={"skip_special_tokens": False})

    def make_tool_call_id(self) -> str:
        return "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))
