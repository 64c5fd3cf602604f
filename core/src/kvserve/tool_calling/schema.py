"""The JSON schemas that force a call: ``tool_choice="required"`` and a named function, as vLLM builds them.

A grammar (``SamplingParams.structured_outputs``) made from them holds the reply to valid calls, which
:mod:`kvserve.tool_calling.forced` then reads.
"""

from __future__ import annotations

from typing import Any

ANY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}
"""The parameters of a function that declares none."""


def parameters_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """A named function's arguments: its ``parameters`` schema (any object if it has none)."""
    return tool["function"].get("parameters") or ANY_OBJECT


def required_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """``tool_choice="required"``: a list of one or more ``{"name", "parameters"}`` objects, each the name of
    one of ``tools`` with arguments valid for it (at most one call unless ``parallel``).

    Each function's ``$defs`` move to the root, where their ``#/$defs/...`` references point from
    there; two functions defining one name differently raise a ValueError naming it.
    """
    definitions: dict[str, Any] = {}
    variants = []
    for tool in tools:
        parameters = dict(parameters_schema(tool))
        own = parameters.pop("$defs", {})
        if not isinstance(own, dict):
            raise ValueError(f"tools: the $defs of function {tool['function']['name']!r} must be an object")
        for name, definition in own.items():
            if definitions.setdefault(name, definition) != definition:
                raise ValueError(f"tools: two functions define '$defs/{name}' differently")
        name = {"type": "string", "enum": [tool["function"]["name"]]}
        variants.append({"properties": {"name": name, "parameters": parameters}, "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    if definitions:
        schema["$defs"] = definitions
    return schema
