"""Structured outputs on llguidance: every constraint becomes an llguidance grammar (Lark, or JSON
naming a JSON schema), checked by ``LLMatcher.validate_grammar`` without a tokenizer (the front end's
check) and built into an ``LLMatcher`` against the engine's tokenizer at compile time; each request
walks a deep copy of that matcher.

EOS ids never reach llguidance: a matcher accepts one where the grammar may end and then reports
itself terminated, so rolling the EOS back is exact (llguidance does not count an EOS it takes after
the grammar has stopped as a token, and rolls back a real one in its place).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kvserve.errors import PluginError
from kvserve.interfaces import StructuredOutputBackend
from kvserve.interfaces.logits_constraint import LogitsConstraint
from kvserve_structured_outputs_guidance.library import LLGUIDANCE

if TYPE_CHECKING:
    import llguidance
    import torch

    from kvserve.config import StructuredOutputsConfig
    from kvserve.structured_outputs import StructuredOutputsParams

logger = logging.getLogger(__name__)


@functools.cache
def _llguidance() -> Any:
    """The llguidance module (with ``hf`` and ``torch``); a PluginError with the install command where it
    is missing or outside the supported versions."""
    reason = LLGUIDANCE.missing_reason()
    if reason is not None:
        raise PluginError(f"structured output backend 'guidance' is unavailable: {reason}")
    import llguidance
    import llguidance.hf
    import llguidance.torch

    return llguidance


@contextmanager
def _reported_as(field: str) -> Iterator[None]:
    """A ValueError (llguidance's, or one raised for its error text) as one naming ``field``."""
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"structured_outputs.{field}: {str(exc).strip()}") from None


def _option(params: StructuredOutputsParams, config: StructuredOutputsConfig, name: str) -> bool:
    """A request's own ``disable_*`` setting, else the engine's."""
    own = getattr(params, name)
    return bool(getattr(config, name) if own is None else own)


def _json_options(params: StructuredOutputsParams, config: StructuredOutputsConfig) -> dict[str, Any]:
    """llguidance's JSON compile options: free whitespace unless disabled, or the request's own pattern."""
    options: dict[str, Any] = {"whitespace_flexible": not _option(params, config, "disable_any_whitespace")}
    if params.whitespace_pattern is not None:
        options["whitespace_pattern"] = params.whitespace_pattern
    return options


def _closed_objects(schema: Any) -> Any:
    """A copy of ``schema`` with ``additionalProperties: false`` on every object schema that lists properties and
    says nothing of others (``disable_additional_properties``, as vLLM does for guidance)."""
    if isinstance(schema, list):
        return [_closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _closed_objects(value) for key, value in schema.items()}
    if "additionalProperties" not in closed and ("properties" in closed or "patternProperties" in closed):
        closed["additionalProperties"] = False
    return closed


def _schema(schema: Any, params: StructuredOutputsParams, config: StructuredOutputsConfig) -> Any:
    """The JSON schema llguidance compiles: objects closed where ``disable_additional_properties`` says."""
    return _closed_objects(schema) if _option(params, config, "disable_additional_properties") else schema


def _structural_tag(text: str, params: StructuredOutputsParams, config: StructuredOutputsConfig) -> str:
    """A Lark grammar of the ``{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`` form (free
    text, and after a trigger its structure's begin, JSON and end). xgrammar's ``format`` form is refused."""
    llg = _llguidance()
    tag = json.loads(text)
    if not isinstance(tag, dict) or "structures" not in tag or "triggers" not in tag:
        raise ValueError("guidance takes the structures/triggers form only (the xgrammar backend has the format form)")
    tags = []
    for structure in tag["structures"]:
        begin = structure["begin"]
        trigger = next((t for t in tag["triggers"] if begin.startswith(t)), None)
        if trigger is None:
            raise ValueError(f"no trigger starts the structure beginning {begin!r} (triggers: {tag['triggers']})")
        schema = _schema(structure["schema"], params, config)
        if isinstance(schema, dict):  # the options go with the schema: its own x-guidance wins
            schema = {"x-guidance": _json_options(params, config), **schema}
        tags.append(llg.StructTag(trigger=trigger, begin=begin, grammar=schema, end=structure["end"]))
    if not tags:
        raise ValueError("no structures")
    return llg.StructTag.to_grammar(tags)


def _grammar(params: StructuredOutputsParams, config: StructuredOutputsConfig) -> str:
    """``params``' constraint as an llguidance grammar, checked without a tokenizer; ValueError naming the field.

    A ``grammar`` is Lark, or GBNF converted to Lark (llguidance's ``grammar_from``).
    """
    llg = _llguidance()
    kind, spec = params.kind, params.spec
    with _reported_as(kind):
        if kind in ("json", "json_object"):
            schema = _schema(spec, params, config) if kind == "json" else {"type": "object"}
            grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=_json_options(params, config))
        elif kind == "regex":
            grammar = llg.LLMatcher.grammar_from_regex(spec)
        elif kind in ("choice", "grammar"):
            grammar = llg.grammar_from(kind, spec)
        else:
            try:
                grammar = _structural_tag(spec, params, config)
            except (KeyError, TypeError, AssertionError) as exc:  # StructTag asserts its own rules
                raise ValueError(f"malformed structural tag ({type(exc).__name__}: {exc})") from None
        error = llg.LLMatcher.validate_grammar(grammar)
        if error:
            raise ValueError(error)
    return grammar


class GuidanceBackend(StructuredOutputBackend):
    """llguidance over the engine's tokenizer (``llguidance.hf.from_tokenizer``), its vocabulary padded
    to the model's ``vocab_size`` (padding ids never allowed) and its EOS tokens the engine's, which the
    token masks allow exactly where the grammar may end."""

    name = "guidance"

    def __init__(
        self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...], config: StructuredOutputsConfig
    ) -> None:
        llg = _llguidance()
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        self.tokenizer = llg.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos_token_ids) or None)

    @classmethod
    def validate(cls, params: StructuredOutputsParams, config: StructuredOutputsConfig) -> None:
        """Build and check ``params``' grammar without a tokenizer (about a millisecond)."""
        _grammar(params, config)

    def compile(self, params: StructuredOutputsParams) -> llguidance.LLMatcher:
        """An ``LLMatcher`` at the start of the grammar (lexer and parser built against the tokenizer),
        never advanced itself: each request's matcher is a copy."""
        grammar = _grammar(params, self.config)
        matcher = _llguidance().LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured_outputs.{params.kind}: {matcher.get_error()}")
        for warning in matcher.get_grammar_warnings():
            logger.warning("structured_outputs.%s: llguidance: %s", params.kind, warning)
        return matcher

    def matcher(self, compiled: llguidance.LLMatcher) -> GuidanceMatcher:
        """A deep copy of the compiled matcher (microseconds)."""
        return GuidanceMatcher(compiled, self.eos_token_ids)


class GuidanceMatcher(LogitsConstraint):
    """One request's copy of an ``LLMatcher``, with the EOS handled here (see the module docstring)."""

    def __init__(self, compiled: llguidance.LLMatcher, eos_token_ids: frozenset[int]) -> None:
        self._compiled = compiled
        self._eos = eos_token_ids
        self._matcher = compiled.deep_copy()
        self._terminated = False

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """llguidance writes the whole row; a matcher in an error state (no token can follow) raises."""
        _llguidance().torch.fill_next_token_bitmask(self._matcher, bitmask, row)
        if self._matcher.is_error():
            raise ValueError(f"structured output grammar failed: {self._matcher.get_error()}")

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Consume in order; an EOS id is accepted only where the grammar may end, and nothing after it."""
        for token in token_ids:
            if self._terminated:
                return False
            if token in self._eos:
                if not self._matcher.is_accepting():
                    return False
                self._terminated = True
            elif not self._matcher.consume_token(token):
                return False
        return True

    def rollback(self, num_tokens: int) -> None:
        """Undo the EOS (if accepted) here, the rest in llguidance."""
        if num_tokens and self._terminated:
            self._terminated = False
            num_tokens -= 1
        if num_tokens and not self._matcher.rollback(num_tokens):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {self._matcher.get_error()}")

    def is_terminated(self) -> bool:
        """True once an EOS id was accepted."""
        return self._terminated

    def reset(self) -> None:
        """A fresh copy of the compiled matcher (``LLMatcher.reset`` keeps an error state)."""
        self._matcher = self._compiled.deep_copy()
        self._terminated = False
