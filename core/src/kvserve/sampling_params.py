"""Per-request sampling parameters, named and validated as in vLLM."""

from __future__ import annotations

import json as jsonlib
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``): dividing by them would overflow."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

LogitsProcessor = Callable[..., Any]
"""``fn(output_token_ids, logits) -> logits`` or ``fn(prompt_token_ids, output_token_ids, logits) -> logits``,
applied to one request's float32 logits row before penalties and temperature."""


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


class SamplingParams(BaseModel):
    """How to pick each next token, when to stop, and what to report.

    ``temperature`` below ``1e-5`` (0 included) is greedy decoding, as in vLLM. Every float must
    be finite (NaN and infinities are rejected); ``seed`` and ``seed + n - 1`` lie within int64;
    ``top_k`` above the vocabulary size is clamped to it (the same as no top-k). Token ids are
    checked against the model's vocabulary by the front end (``kvserve.engine.validation.check_request``).
    Invalid values or combinations raise a ``ValueError`` naming the field.
    """

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, arbitrary_types_allowed=True, allow_inf_nan=False
    )

    n: int = Field(1, ge=1, description="Completions per prompt; the prompt's KV blocks are shared")
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, description="0 or -1: no top-k filtering; above the vocabulary: clamped to it")
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    seed: int | None = Field(
        None, ge=INT64_MIN, le=INT64_MAX, description="Per-request seed: the same output whatever the batch"
    )
    max_tokens: int | None = Field(16, ge=1, description="None: until EOS or max_model_len")
    min_tokens: int = Field(0, ge=0, description="EOS, stop tokens and stop strings are ignored before this")
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = Field(None, ge=0, le=20, description="Top-N logprobs per generated token")
    prompt_logprobs: int | None = Field(None, ge=0, le=20, description="Top-N logprobs per prompt token")
    logit_bias: dict[int, float] = Field(default_factory=dict)
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] = Field(default_factory=list)
    logits_processors: list[LogitsProcessor] = Field(default_factory=list)
    extra_args: dict[str, Any] | None = Field(
        None, description="Arguments for the engine's batch-level logits processors (vLLM's extra_args)"
    )
    structured_outputs: StructuredOutputsParams | None = Field(
        None, description="A constraint the output must match: a JSON schema, regex, choice or grammar"
    )
    skip_special_tokens: bool = True
    detokenize: bool = True
    output_kind: Literal["cumulative", "delta", "final_only"] = Field(
        "cumulative", description="Streamed outputs carry all text so far, only the new text, or nothing until done"
    )

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else ([] if value is None else value)

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: list[str]) -> list[str]:
        if any(s == "" for s in value):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_range(cls, value: dict[int, float]) -> dict[int, float]:
        bad = {t: b for t, b in value.items() if not -100.0 <= b <= 100.0}
        if bad:
            raise ValueError(f"biases must lie in [-100, 100], got {bad}")
        return value

    @field_validator("allowed_token_ids")
    @classmethod
    def _allowed_not_empty(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and not value:
            raise ValueError("allowed_token_ids must not be empty (omit it to allow every token)")
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> SamplingParams:
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.detokenize is False and self.stop:
            raise ValueError("stop strings need detokenize=True")
        if self.seed is not None and self.seed + self.n - 1 > INT64_MAX:
            raise ValueError(f"seed: seed + n - 1 ({self.seed + self.n - 1}) exceeds int64 (sequence i uses seed + i)")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def uses_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
