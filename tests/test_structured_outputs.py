"""Structured outputs offline (``LLM.generate``) with the embedded SmolLM2 and each real backend:
sampled at temperature 0.9 over many seeds, every output that finishes under a JSON schema
validates, ``choice`` outputs are choices, ``regex`` outputs match; bad constraints are refused
by name; constrained neighbours leave an unconstrained request's tokens as unconstrained ones do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from kvserve import LLM, SamplingParams
from kvserve.sampling_params import StructuredOutputsParams
from kvserve.structured_outputs.selection import usable_backends

SEEDS = range(12)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
    },
    "required": ["name", "age", "city"],
}


pytestmark = pytest.mark.skipif(
    not usable_backends(), reason="no structured output backend installed (xgrammar, guidance)"
)


@pytest.fixture(scope="module", params=usable_backends())
def llm(request):
    engine = LLM(
        max_model_len=512, structured_outputs_config={"backend": request.param, "disable_any_whitespace": True}
    )
    yield engine
    engine.engine.shutdown()


def chat(llm: LLM, text: str) -> str:
    messages = [{"role": "user", "content": text}]
    return llm.engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def sampled(seed: int, max_tokens: int = 96, **constraint) -> SamplingParams:
    return SamplingParams(
        temperature=0.9, seed=seed, max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(**constraint)
    )


def test_json_schema_outputs_validate(llm):
    prompt = chat(llm, "Describe a person as JSON with name, age and city.")
    outputs = llm.generate([prompt] * len(SEEDS), [sampled(s, json=PERSON) for s in SEEDS], use_tqdm=False)
    finished = [o.outputs[0] for o in outputs if o.outputs[0].finish_reason == "stop"]
    assert len(finished) >= len(SEEDS) * 3 // 4, [o.outputs[0].text for o in outputs]
    for out in finished:
        jsonschema.validate(json.loads(out.text), PERSON)


def test_json_object_outputs_parse(llm):
    prompt = chat(llm, "Give me a JSON object about the weather.")
    outputs = llm.generate([prompt] * 6, [sampled(s, json_object=True) for s in range(6)], use_tqdm=False)
    for out in (o.outputs[0] for o in outputs if o.outputs[0].finish_reason == "stop"):
        assert isinstance(json.loads(out.text), dict), out.text


def test_choice_outputs_are_choices(llm):
    choices = ["positive", "negative", "neutral"]
    prompt = chat(llm, "Is 'I loved this film' positive, negative or neutral?")
    outputs = llm.generate([prompt] * len(SEEDS), [sampled(s, choice=choices) for s in SEEDS], use_tqdm=False)
    for out in outputs:
        assert out.outputs[0].text in choices and out.outputs[0].finish_reason == "stop", out.outputs[0]


def test_regex_outputs_match(llm):
    pattern = r"\d{3}-[A-Z]{2}-\d{2}"
    prompt = chat(llm, "Invent a licence plate.")
    outputs = llm.generate([prompt] * len(SEEDS), [sampled(s, regex=pattern) for s in SEEDS], use_tqdm=False)
    for out in outputs:
        assert re.fullmatch(pattern, out.outputs[0].text) and out.outputs[0].finish_reason == "stop", out.outputs[0]


def test_grammar_outputs_are_sentences(llm):
    grammar = 'root ::= "The answer is " ("yes" | "no") "."'
    prompt = chat(llm, "Is the sky blue?")
    outputs = llm.generate([prompt] * 4, [sampled(s, grammar=grammar) for s in range(4)], use_tqdm=False)
    for out in outputs:
        assert out.outputs[0].text in ("The answer is yes.", "The answer is no."), out.outputs[0].text


def test_unconstrained_neighbours_keep_their_tokens(llm):
    """``plain`` decodes beside three unconstrained requests of its length either way, so every step it
    is in has four rows or more: the embedded GGUF, kept packed in bfloat16, multiplies steps of up to
    three rows on activations quantized to int8 (llama.cpp's integer dots) and more rows on the tiles,
    so with fewer rows it may take other tokens."""
    plain = SamplingParams(temperature=1.0, seed=3, max_tokens=16, ignore_eos=True)
    others = [SamplingParams(temperature=1.0, seed=seed, max_tokens=16, ignore_eos=True) for seed in (4, 5, 6)]
    prompt = chat(llm, "Tell me about the sea.")
    unconstrained = llm.generate([prompt] * 4, [plain, *others], use_tqdm=False)[0].outputs[0].token_ids
    neighbours = [*others, sampled(1, json=PERSON), sampled(2, regex="[a-z]{4}")]
    mixed = llm.generate([prompt] * 6, [plain, *neighbours], use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == unconstrained


@pytest.mark.parametrize(
    ("constraint", "field"),
    [
        ({"json": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, "json"),
        ({"regex": "(unclosed"}, "regex"),
        ({"grammar": "root ::= ("}, "grammar"),
    ],
)
def test_a_malformed_constraint_is_refused_by_name(llm, constraint, field):
    with pytest.raises(ValueError, match=field):
        llm.generate("x", SamplingParams(structured_outputs=StructuredOutputsParams(**constraint)), use_tqdm=False)
    # Sampled at the default temperature: without ignore_eos SmolLM2 may draw EOS within the 2 tokens.
    out = llm.generate("x", SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert out[0].outputs[0].finish_reason == "length"


def test_the_documented_offline_example_runs(capsys):
    """docs/structured_outputs.md's ``LLM`` example as written: its JSON validates, its choice and regex hold."""
    page = (Path(__file__).parents[1] / "docs" / "structured_outputs.md").read_text()
    example = next(block for block in re.findall(r"```python\n(.*?)```", page, re.DOTALL) if "LLM()" in block)
    scope: dict = {}
    exec(example, scope)  # noqa: S102 - the page's own code, run as a reader would
    jsonschema.validate(json.loads(capsys.readouterr().out.strip().splitlines()[-1]), scope["schema"])
    llm = scope["llm"]
    answer = llm.generate(["Is the sky blue? "], scope["yes_no"], use_tqdm=False)[0].outputs[0].text
    date = llm.generate(["Today's date: "], scope["date"], use_tqdm=False)[0].outputs[0].text
    llm.engine.shutdown()
    assert answer in ("yes", "no") and re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), (answer, date)
