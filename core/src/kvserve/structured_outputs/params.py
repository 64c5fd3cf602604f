"""What a request asks its output to match: vLLM's ``StructuredOutputsParams``."""

from __future__ import annotations

import json as jsonlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ConstraintKind = Literal["json", "json_object", "regex", "choice", "grammar", "structural_tag"]
CONSTRAINT_KINDS: tuple[ConstraintKind, ...] = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


class StructuredOutputsParams(BaseModel):
    """Exactly one constraint on the output, as in vLLM:

    - ``json``: a JSON schema (a dict, or its JSON text); the output is a JSON value it validates;
    - ``json_object``: any JSON object (OpenAI's ``response_format={"type": "json_object"}``);
    - ``regex``: the output matches the regular expression in full;
    - ``choice``: the output is one of these strings;
    - ``grammar``: an EBNF (GBNF) or Lark grammar the output is a sentence of;
    - ``structural_tag``: xgrammar's structural tag (JSON text): free text with tagged, constrained parts.

    ``disable_any_whitespace`` / ``disable_additional_properties`` override the engine's
    ``structured_outputs_config`` for this request when set. Two constraints, or none, raise a
    ValueError naming the fields.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    json_schema: dict[str, Any] | str | None = Field(None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None

    @model_validator(mode="after")
    def _one_constraint(self) -> StructuredOutputsParams:
        given = [kind for kind in CONSTRAINT_KINDS if self._value(kind) not in (None, False)]
        if len(given) != 1:
            what = f"got {', '.join(given)}" if given else "got none"
            raise ValueError(f"structured_outputs: exactly one of {', '.join(CONSTRAINT_KINDS)} must be set ({what})")
        if self.choice is not None and (not self.choice or any(not isinstance(c, str) or c == "" for c in self.choice)):
            raise ValueError("structured_outputs.choice: must list at least one non-empty string")
        if isinstance(self.json_schema, str):
            try:
                jsonlib.loads(self.json_schema)
            except ValueError as exc:
                raise ValueError(f"structured_outputs.json: not valid JSON: {exc}") from None
        return self

    def _value(self, kind: ConstraintKind) -> Any:
        return self.json_schema if kind == "json" else getattr(self, kind)

    @property
    def kind(self) -> ConstraintKind:
        """Which constraint is set."""
        return next(k for k in CONSTRAINT_KINDS if self._value(k) not in (None, False))

    @property
    def spec(self) -> Any:
        """The constraint's value: the schema as a dict for ``json``, True for ``json_object``."""
        value = self._value(self.kind)
        return jsonlib.loads(value) if self.kind == "json" and isinstance(value, str) else value

    def schema_text(self) -> str:
        """The ``json`` schema as compact JSON text with sorted keys (stable: a cache key part)."""
        return jsonlib.dumps(self.spec, sort_keys=True, separators=(",", ":"))

    def cache_key(self) -> str:
        """Equal for requests whose constraint (and per-request options) compile to the same grammar."""
        options = (self.disable_any_whitespace, self.disable_additional_properties, self.whitespace_pattern)
        value = self.schema_text() if self.kind == "json" else jsonlib.dumps(self.spec, sort_keys=True)
        return f"{self.kind}:{value}:{options}"
