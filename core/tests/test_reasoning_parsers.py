"""Core's reasoning parsers, ``deepseek_r1`` and ``qwen3``: what each makes of typical outputs, whole and
streamed, and where each says the reasoning ends (the contract checks that both forms agree)."""

from __future__ import annotations

import pytest

from kvserve.errors import UnknownComponentError
from kvserve.reasoning import (
    DeepSeekR1ReasoningParser,
    Qwen3ReasoningParser,
    load_reasoning_parser,
    reasoning_parser_class,
)
from kvserve.testing.contracts.reasoning_parser import embedded_tokenizer, stream


@pytest.fixture(scope="module")
def tokenizer():
    return embedded_tokenizer()


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("2 + 2 is 4.</think>\n\nThe answer is 4.", "2 + 2 is 4.", "\n\nThe answer is 4."),
        ("<think>2 + 2 is 4.</think>4", "2 + 2 is 4.", "4"),  # the model repeats the prompt's <think>
        ("Still thinking when max_tokens hit", "Still thinking when max_tokens hit", None),
        ("</think>4", None, "4"),
        ("a</think>b</think>c", "a", "b</think>c"),
        ("x<think>y</think>z", "x<think>y", "z"),  # only a leading <think> is the model's own
        ("", None, None),
    ],
)
def test_deepseek_r1_starts_inside_the_reasoning(tokenizer, text, reasoning, content):
    parser = DeepSeekR1ReasoningParser(tokenizer)
    assert parser.extract_reasoning(text) == (reasoning, content)
    assert stream(parser, list(text)) == (reasoning or "", content or "")


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        ("<think>\n2 + 2 is 4.\n</think>\n\nThe answer is 4.", "\n2 + 2 is 4.\n", "\n\nThe answer is 4."),
        ("The answer is 4.", None, "The answer is 4."),  # no <think>: no reasoning
        ("2 + 2 is 4.</think>4", None, "2 + 2 is 4.</think>4"),
        ("<think>cut short", "cut short", None),
        ("<think></think>4", None, "4"),
        ("Hm <think>x</think> so 4", "x", "Hm  so 4"),
    ],
)
def test_qwen3_reasons_only_inside_think_tags(tokenizer, text, reasoning, content):
    parser = Qwen3ReasoningParser(tokenizer)
    assert parser.extract_reasoning(text) == (reasoning, content)
    assert stream(parser, list(text)) == (reasoning or "", content or "")


def test_qwen3_with_thinking_off_answers_everything_as_content(tokenizer):
    parser = Qwen3ReasoningParser(tokenizer, {"enable_thinking": False})
    text = "<think>x</think>4"
    assert parser.extract_reasoning(text) == (None, text)
    assert stream(parser, [text]) == ("", text)
    assert parser.is_reasoning_end([])
    assert not Qwen3ReasoningParser(tokenizer, {"enable_thinking": True}).is_reasoning_end([])


def test_a_tag_cut_between_deltas_is_held_back_until_it_is_known(tokenizer):
    parser = DeepSeekR1ReasoningParser(tokenizer)
    assert parser.extract_reasoning_streaming("Done </th") == ("Done ", None)
    assert parser.extract_reasoning_streaming("ink>\n") == (None, "\n")
    assert parser.extract_reasoning_streaming("4") == (None, "4")
    assert parser.finish_streaming() == (None, None)
    # A held-back beginning that never became the tag is handed out at the end.
    assert parser.extract_reasoning_streaming("a </") == ("a ", None)
    assert parser.finish_streaming() == ("</", None)


def test_the_reasoning_ends_at_the_last_marker(tokenizer):
    """As vLLM's parsers: the end tag after the last start tag (the prompt's own, for a chat template)."""
    parser = Qwen3ReasoningParser(tokenizer)
    start = tokenizer.encode("<think>", add_special_tokens=False)
    end = list(parser.reasoning_end_token_ids)
    assert end == tokenizer.encode("</think>", add_special_tokens=False)
    words = tokenizer.encode(" so it is", add_special_tokens=False)
    assert parser.is_reasoning_end(start + words + end + words)
    assert not parser.is_reasoning_end(start + words)
    assert not parser.is_reasoning_end(start + words + end + start)  # a new turn's reasoning opened
    assert not parser.is_reasoning_end(words)


def test_parsers_are_registered_and_unknown_names_are_refused(tokenizer):
    assert reasoning_parser_class("qwen3") is Qwen3ReasoningParser
    assert reasoning_parser_class(None) is None
    parser = load_reasoning_parser("deepseek_r1", tokenizer, {"enable_thinking": False})
    assert isinstance(parser, DeepSeekR1ReasoningParser) and parser.chat_template_kwargs == {"enable_thinking": False}
    with pytest.raises(UnknownComponentError, match=r"unknown reasoning parser 'nope'; available: deepseek_r1, qwen3"):
        reasoning_parser_class("nope")
