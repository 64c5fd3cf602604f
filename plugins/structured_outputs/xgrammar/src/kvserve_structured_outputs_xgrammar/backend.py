"""Structured outputs on xgrammar: every constraint becomes an ``xgrammar.Grammar``, compiled against
the engine's tokenizer into a ``CompiledGrammar`` that each request's ``GrammarMatcher`` walks.

The same parse serves :meth:`XgrammarBackend.validate` (no tokenizer: the front end's check) and
:meth:`XgrammarBackend.compile`, so a constraint that validates compiles, and both report the
compiler's own message under the request field that holds the constraint.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from kvserve.errors import PluginError
from kvserve.interfaces import StructuredOutputBackend
from kvserve.interfaces.logits_constraint import LogitsConstraint
from kvserve_structured_outputs_xgrammar.library import XGRAMMAR

if TYPE_CHECKING:
    import torch
    import xgrammar

    from kvserve.config import StructuredOutputsConfig
    from kvserve.structured_outputs import StructuredOutputsParams

_SOURCE_LOCATION = re.compile(r"^\[[0-9:.]+\] \S+:\d+: ")
"""How xgrammar's C++ errors begin (``[13:14:24] /project/cpp/regex_converter.cc:94: ``): not for users."""


@functools.cache
def _xgrammar() -> Any:
    """The xgrammar module; a PluginError with the install command where it is missing or too old."""
    reason = XGRAMMAR.missing_reason()
    if reason is not None:
        raise PluginError(f"structured output backend 'xgrammar' is unavailable: {reason}")
    import xgrammar

    return xgrammar


@contextmanager
def _reported_as(field: str) -> Iterator[None]:
    """xgrammar's errors (RuntimeError and its subclasses, ValueError) as a ValueError naming ``field``."""
    try:
        yield
    except (RuntimeError, ValueError) as exc:
        message = _SOURCE_LOCATION.sub("", str(exc)).strip()
        raise ValueError(f"structured_outputs.{field}: {message}") from None


def _option(params: StructuredOutputsParams, config: StructuredOutputsConfig, name: str) -> bool:
    """A request's own ``disable_*`` setting, else the engine's."""
    own = getattr(params, name)
    return bool(getattr(config, name) if own is None else own)


def _choice_ebnf(choices: list[str]) -> str:
    """``root ::= "a" | "b"``: a JSON string literal is an EBNF one (quotes, backslashes and control
    characters escaped), so any choice text is matched literally."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)


def _structural_tag(text: str) -> str:
    """xgrammar's structural tag JSON. The older form vLLM also accepts, ``{"structures": [{"begin",
    "schema", "end"}], "triggers": [...]}``, is rewritten as the ``triggered_tags`` format it means."""
    tag = json.loads(text)
    if not isinstance(tag, dict) or "structures" not in tag:
        return text
    try:
        tags = [
            {"type": "tag", "begin": s["begin"], "content": {"type": "json_schema", "json_schema": s["schema"]},
             "end": s["end"]}
            for s in tag["structures"]
        ]  # fmt: skip
        triggered = {"type": "triggered_tags", "triggers": tag["triggers"], "tags": tags}
    except (KeyError, TypeError) as exc:
        raise ValueError(
            f"the structures/triggers form needs 'triggers' and structures with 'begin', 'schema' and 'end' "
            f"(missing {exc})"
        ) from None
    return json.dumps({"type": "structural_tag", "format": triggered})


def _grammar(
    params: StructuredOutputsParams, config: StructuredOutputsConfig, tokenizer_info: Any = None
) -> xgrammar.Grammar:
    """``params``' constraint as an xgrammar Grammar (parsed, not yet compiled); ValueError naming the field.

    JSON follows the schema's property order; ``disable_additional_properties`` is xgrammar's strict mode
    (no property or item the schema does not name). A grammar with ``::=`` is EBNF (GBNF), else Lark.
    ``tokenizer_info`` lets Lark name special tokens; validation goes without it.
    """
    xgr = _xgrammar()
    kind, spec = params.kind, params.spec
    if kind in ("json", "json_object") and params.whitespace_pattern is not None:
        raise ValueError(
            "structured_outputs.whitespace_pattern: not supported by xgrammar (the guidance backend has it)"
        )
    with _reported_as(kind):
        if kind in ("json", "json_object"):
            schema = spec if kind == "json" else {"type": "object"}
            return xgr.Grammar.from_json_schema(
                json.dumps(schema),
                any_whitespace=not _option(params, config, "disable_any_whitespace"),
                strict_mode=_option(params, config, "disable_additional_properties"),
            )
        if kind == "regex":
            return xgr.Grammar.from_regex(spec)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(_choice_ebnf(spec))
        if kind == "grammar":
            if "::=" in spec:
                return xgr.Grammar.from_ebnf(spec)
            return xgr.Grammar.from_lark(spec, tokenizer_info=tokenizer_info)
        return xgr.Grammar.from_structural_tag(_structural_tag(spec))


class XgrammarBackend(StructuredOutputBackend):
    """xgrammar's ``GrammarCompiler`` over the engine's tokenizer: its vocabulary padded to the model's
    ``vocab_size`` (padding ids never allowed) and its stop tokens the engine's EOS ids, which each
    matcher allows exactly where the grammar may end."""

    name = "xgrammar"

    def __init__(
        self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...], config: StructuredOutputsConfig
    ) -> None:
        xgr = _xgrammar()
        self.config = config
        self.tokenizer_info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(eos_token_ids) or None
        )
        # Core caches compiled grammars by their constraint: xgrammar's own cache would hold second copies.
        self.compiler = xgr.GrammarCompiler(self.tokenizer_info, cache_enabled=False)

    @classmethod
    def validate(cls, params: StructuredOutputsParams, config: StructuredOutputsConfig) -> None:
        """Parse ``params``' schema, regex, grammar or structural tag (no tokenizer; milliseconds)."""
        _grammar(params, config)

    def compile(self, params: StructuredOutputsParams) -> xgrammar.CompiledGrammar:
        """The grammar compiled against the tokenizer: token masks precomputed where they do not depend on the stack."""
        grammar = _grammar(params, self.config, self.tokenizer_info)
        with _reported_as(params.kind):
            return self.compiler.compile_grammar(grammar)

    def matcher(self, compiled: xgrammar.CompiledGrammar) -> XgrammarMatcher:
        """A ``GrammarMatcher`` of its own at the start of ``compiled``."""
        return XgrammarMatcher(_xgrammar().GrammarMatcher(compiled))


class XgrammarMatcher(LogitsConstraint):
    """One request's ``xgrammar.GrammarMatcher``: it terminates on accepting an EOS id, and rolls back
    any number of accepted tokens (the EOS included)."""

    def __init__(self, matcher: xgrammar.GrammarMatcher) -> None:
        self._matcher = matcher

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        """xgrammar writes the whole row of the int32 host bitmask."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Accept in order, stopping at the first token the grammar refuses (False)."""
        return all(self._matcher.accept_token(token) for token in token_ids)

    def rollback(self, num_tokens: int) -> None:
        """xgrammar keeps the whole history: any number up to the tokens accepted."""
        self._matcher.rollback(num_tokens)

    def is_terminated(self) -> bool:
        """True once an EOS id was accepted."""
        return self._matcher.is_terminated()

    def reset(self) -> None:
        """The state before the first token."""
        self._matcher.reset()
