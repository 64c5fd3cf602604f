"""What the guidance backend does beyond the contract: its registration, the forms it compiles
(structural tags of the structures/triggers form, Lark and GBNF, a whitespace pattern), closing
objects for ``disable_additional_properties``, and matchers after an error."""

from __future__ import annotations

import json
import re
from importlib import metadata

import pytest
import torch

from kvserve.config import StructuredOutputsConfig
from kvserve.errors import PluginError
from kvserve.interfaces.logits_constraint import bitmask_words
from kvserve.structured_outputs import StructuredOutputsParams
from kvserve.testing.contracts.structured_output import embedded_model_tokenizer
from kvserve_structured_outputs_guidance import backend as guidance_backend
from kvserve_structured_outputs_guidance import plugin
from kvserve_structured_outputs_guidance.backend import GuidanceBackend

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CONFIG = StructuredOutputsConfig()


@pytest.fixture(scope="module")
def tokenizer():
    return embedded_model_tokenizer()


@pytest.fixture(scope="module")
def backend(tokenizer):
    return GuidanceBackend(tokenizer, len(tokenizer), (tokenizer.eos_token_id,), CONFIG)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def accepts(backend, tokenizer, params, text) -> bool:
    """Whether a fresh matcher takes ``text`` and then EOS, and terminates."""
    matcher = backend.matcher(backend.compile(params))
    return matcher.accept_tokens([*encode(tokenizer, text), tokenizer.eos_token_id]) and matcher.is_terminated()


def registrations() -> list[tuple[str, str, dict]]:
    found = []
    plugin.register_structured_output_backends(lambda name, target, **facts: found.append((name, target, facts)))
    return found


def test_registered_as_guidance_below_xgrammar():
    [(name, target, facts)] = registrations()
    assert (name, target) == ("guidance", "kvserve_structured_outputs_guidance.backend:GuidanceBackend")
    assert facts == {"priority": 10, "unavailable": None}


def test_without_llguidance_it_is_listed_with_the_reason_and_refuses_with_it(monkeypatch, tokenizer):
    real_version = metadata.version

    def version(distribution):
        if distribution == "llguidance":
            raise metadata.PackageNotFoundError(distribution)
        return real_version(distribution)

    monkeypatch.setattr(metadata, "version", version)
    guidance_backend._llguidance.cache_clear()
    try:
        reason = "llguidance is not installed (pip install 'llguidance>=1.0,<2')"
        assert registrations()[0][2]["unavailable"] == reason
        with pytest.raises(PluginError, match=re.escape(f"'guidance' is unavailable: {reason}")):
            GuidanceBackend.validate(StructuredOutputsParams(regex="a"), CONFIG)
    finally:
        guidance_backend._llguidance.cache_clear()


def test_gbnf_and_lark_grammars(backend, tokenizer):
    for grammar in ('root ::= "(" [0-9]+ ")"', 'start: "(" NUMBER ")"\nNUMBER: /[0-9]+/'):
        params = StructuredOutputsParams(grammar=grammar)
        GuidanceBackend.validate(params, CONFIG)
        assert accepts(backend, tokenizer, params, "(42)") and not accepts(backend, tokenizer, params, "(4a)")


def test_choices_are_matched_literally(backend, tokenizer):
    choices = ['say "hi"\n', "back\\slash", "café ☕", 'a" | "b']
    params = StructuredOutputsParams(choice=choices)
    for choice in choices:
        assert accepts(backend, tokenizer, params, choice), choice
    assert not accepts(backend, tokenizer, params, "a")


def test_a_whitespace_pattern_replaces_free_whitespace(backend, tokenizer):
    params = StructuredOutputsParams(json=SCHEMA, whitespace_pattern="[ ]?")
    assert accepts(backend, tokenizer, params, '{ "city": "x" }')
    assert not accepts(backend, tokenizer, params, '{\n"city": "x"}')


def test_disable_additional_properties_closes_nested_objects_that_say_nothing(backend, tokenizer):
    schema = {
        "type": "object",
        "properties": {
            "inner": {"type": "object", "properties": {"a": {"type": "integer"}}},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
        },
    }
    params = StructuredOutputsParams(json=schema, disable_additional_properties=True)
    assert accepts(backend, tokenizer, params, '{"inner": {"a": 1}, "open": {"x": 2}}')
    assert not accepts(backend, tokenizer, params, '{"inner": {"a": 1, "b": 2}}')
    assert not accepts(backend, tokenizer, params, '{"other": 1}')


def test_structural_tags_of_the_structures_and_triggers_form(backend, tokenizer):
    spec = {"structures": [{"begin": "<weather>", "schema": SCHEMA, "end": "</weather>"}], "triggers": ["<weather"]}
    params = StructuredOutputsParams(structural_tag=json.dumps(spec))
    GuidanceBackend.validate(params, CONFIG)
    assert accepts(backend, tokenizer, params, 'Let me look. <weather>{"city": "Paris"}</weather> Done.')
    assert not accepts(backend, tokenizer, params, 'Let me look. <weather>{"town": "Paris"}</weather>')


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"type": "structural_tag", "format": {"type": "triggered_tags"}}, "structures/triggers form only"),
        ({"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": ["<b"]}, "no trigger starts"),
        ({"structures": [{"begin": "<a>", "end": "</a>"}], "triggers": ["<a"]}, "KeyError: 'schema'"),
    ],
)
def test_structural_tags_it_cannot_compile_are_refused_naming_the_field(spec, words):
    with pytest.raises(ValueError, match=r"^structured_outputs\.structural_tag: ") as refused:
        GuidanceBackend.validate(StructuredOutputsParams(structural_tag=json.dumps(spec)), CONFIG)
    assert words in str(refused.value)


def test_after_a_refused_token_the_mask_raises_and_reset_starts_over(backend, tokenizer):
    matcher = backend.matcher(backend.compile(StructuredOutputsParams(json=SCHEMA)))
    assert not matcher.accept_tokens(encode(tokenizer, "abc"))
    bitmask = torch.zeros(1, bitmask_words(len(tokenizer)), dtype=torch.int32)
    with pytest.raises(ValueError, match="structured output grammar failed: .*doesn't satisfy the grammar"):
        matcher.fill_bitmask(bitmask, 0)
    matcher.reset()
    assert matcher.accept_tokens([*encode(tokenizer, '{"city": "Rome"}'), tokenizer.eos_token_id])
    assert matcher.is_terminated()
