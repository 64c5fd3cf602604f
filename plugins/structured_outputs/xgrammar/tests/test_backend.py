"""What the xgrammar backend does beyond the contract: its registration, the forms it compiles
(structural tags old and new, Lark, literal choices) and the messages it gives."""

from __future__ import annotations

import json
import re
from importlib import metadata

import pytest

from kvserve.config import StructuredOutputsConfig
from kvserve.errors import PluginError
from kvserve.structured_outputs import StructuredOutputsParams
from kvserve.testing.contracts.structured_output import embedded_model_tokenizer
from kvserve_structured_outputs_xgrammar import backend as xgrammar_backend
from kvserve_structured_outputs_xgrammar import plugin
from kvserve_structured_outputs_xgrammar.backend import XgrammarBackend

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CONFIG = StructuredOutputsConfig()


@pytest.fixture(scope="module")
def tokenizer():
    return embedded_model_tokenizer()


@pytest.fixture(scope="module")
def backend(tokenizer):
    return XgrammarBackend(tokenizer, len(tokenizer), (tokenizer.eos_token_id,), CONFIG)


def accepts(backend, tokenizer, params, text) -> bool:
    """Whether a fresh matcher takes ``text`` and then EOS, and terminates."""
    matcher = backend.matcher(backend.compile(params))
    tokens = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    return matcher.accept_tokens(tokens) and matcher.is_terminated()


def registrations() -> list[tuple[str, str, dict]]:
    found = []
    plugin.register_structured_output_backends(lambda name, target, **facts: found.append((name, target, facts)))
    return found


def test_registered_as_xgrammar_above_guidance():
    [(name, target, facts)] = registrations()
    assert (name, target) == ("xgrammar", "kvserve_structured_outputs_xgrammar.backend:XgrammarBackend")
    assert facts == {"priority": 20, "unavailable": None}


def test_without_xgrammar_it_is_listed_with_the_reason_and_refuses_with_it(monkeypatch, tokenizer):
    real_version = metadata.version

    def version(distribution):
        if distribution == "xgrammar":
            raise metadata.PackageNotFoundError(distribution)
        return real_version(distribution)

    monkeypatch.setattr(metadata, "version", version)
    xgrammar_backend._xgrammar.cache_clear()
    try:
        reason = "xgrammar is not installed (pip install 'xgrammar>=0.2.9,<0.3')"
        assert registrations()[0][2]["unavailable"] == reason
        with pytest.raises(PluginError, match=re.escape(f"'xgrammar' is unavailable: {reason}")):
            XgrammarBackend(tokenizer, len(tokenizer), (2,), CONFIG)
    finally:
        xgrammar_backend._xgrammar.cache_clear()


def test_messages_are_the_compilers_without_its_source_location():
    with pytest.raises(ValueError) as refused:
        XgrammarBackend.validate(StructuredOutputsParams(regex="a(b"), CONFIG)
    assert str(refused.value) == (
        "structured_outputs.regex: Regex parsing error at position 4: The parenthesis is not closed."
    )


def test_whitespace_pattern_is_refused_naming_the_field():
    params = StructuredOutputsParams(json=SCHEMA, whitespace_pattern=" ?")
    with pytest.raises(ValueError, match=r"^structured_outputs\.whitespace_pattern: .*xgrammar"):
        XgrammarBackend.validate(params, CONFIG)


def test_choices_are_matched_literally(backend, tokenizer):
    choices = ['say "hi"\n', "back\\slash", "café ☕", 'a" | "b']
    params = StructuredOutputsParams(choice=choices)
    for choice in choices:
        assert accepts(backend, tokenizer, params, choice), choice
    assert not accepts(backend, tokenizer, params, "a")


def test_json_keeps_the_schemas_property_order(backend, tokenizer):
    schema = {
        "type": "object",
        "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}},
        "required": ["b", "a"],
    }
    params = StructuredOutputsParams(json=json.dumps(schema))
    assert accepts(backend, tokenizer, params, '{"b": 1, "a": 2}')
    assert not accepts(backend, tokenizer, params, '{"a": 2, "b": 1}')


def test_json_object_is_an_object(backend, tokenizer):
    params = StructuredOutputsParams(json_object=True)
    assert accepts(backend, tokenizer, params, '{"a": [1, {"b": null}]}')
    assert not accepts(backend, tokenizer, params, "[1]")


def test_a_grammar_without_the_ebnf_rule_sign_is_lark(backend, tokenizer):
    params = StructuredOutputsParams(grammar='start: "(" NUMBER ")"\nNUMBER: /[0-9]+/')
    XgrammarBackend.validate(params, CONFIG)
    assert accepts(backend, tokenizer, params, "(42)") and not accepts(backend, tokenizer, params, "(4a)")


@pytest.mark.parametrize("form", ["format", "structures"])
def test_structural_tags_in_both_forms(backend, tokenizer, form):
    if form == "format":
        tag = {"type": "tag", "begin": "<weather>", "content": {"type": "json_schema", "json_schema": SCHEMA},
               "end": "</weather>"}  # fmt: skip
        spec = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<weather"], "tags": [tag]}}
    else:
        spec = {"structures": [{"begin": "<weather>", "schema": SCHEMA, "end": "</weather>"}], "triggers": ["<weather"]}
    params = StructuredOutputsParams(structural_tag=json.dumps(spec))
    XgrammarBackend.validate(params, CONFIG)
    assert accepts(backend, tokenizer, params, 'Let me look. <weather>{"city": "Paris"}</weather> Done.')
    assert not accepts(backend, tokenizer, params, 'Let me look. <weather>{"town": "Paris"}</weather>')


def test_a_malformed_structural_tag_is_refused_naming_the_field():
    spec = json.dumps({"structures": [{"begin": "<a>", "end": "</a>"}], "triggers": ["<a"]})
    with pytest.raises(ValueError, match=r"^structured_outputs\.structural_tag: .*'schema'"):
        XgrammarBackend.validate(StructuredOutputsParams(structural_tag=spec), CONFIG)
