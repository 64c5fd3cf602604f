"""The ReasoningParser contract: a streamed output splits exactly as the whole output does, however it is
cut into deltas; parsers keep their streams apart; the reasoning's end ids end the reasoning."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from functools import cache
from typing import Any, ClassVar

from kvserve.interfaces.reasoning_parser import ReasoningParser
from kvserve.testing.contracts._base import ComponentContract, violation

OUTPUTS = (
    "",
    "The answer is 4.",
    "<think>2 + 2 is 4.</think>The answer is 4.",
    "<think>\nLet me add: 2 + 2 = 4.\n</think>\n\nThe answer is **4**.",
    "2 + 2 is 4.</think>\n\n4",
    "<think>Cut short before the end",
    "Cut short inside the end tag </thi",
    "<think>Cut short inside the end tag </thi",
    "<thi",
    "<think>",
    "</think>",
    "<think></think>",
    "<think>a < b and c </ d, so </think not yet</think>yes <think>again</think>",
    "Before <think>inside</think> after",
    "<think>Ünïcödé ✓ 思考</think>答え 🙂",
    "<<think>>nested</think></think>",
)
"""Canned outputs of a ``<think>…</think>`` model, cut short and malformed ones included."""


@cache
def embedded_tokenizer() -> Any:
    """The tokenizer of the embedded SmolLM2, the model kvserve serves by default."""
    from kvserve.loader import open_model

    return open_model(None).tokenizer


def _split(parts: Sequence[tuple[str | None, str | None]]) -> tuple[str, str]:
    return "".join(r or "" for r, _ in parts), "".join(c or "" for _, c in parts)


def stream(parser: ReasoningParser, deltas: Sequence[str]) -> tuple[str, str]:
    """``(reasoning, content)``: the parser's deltas for ``deltas`` and its finish, joined."""
    parts = [parser.extract_reasoning_streaming(delta) for delta in deltas]
    return _split([*parts, parser.finish_streaming()])


def cuts(text: str, rng: random.Random) -> Iterator[list[str]]:
    """``text`` as one delta, one character a delta, cut in two at every boundary, and cut at random
    places with empty deltas between (a token may decode to no text yet)."""
    yield [text]
    yield list(text)
    for at in range(1, len(text)):
        yield [text[:at], text[at:]]
    for _ in range(8):
        bounds = sorted(rng.choices(range(len(text) + 1), k=rng.randint(1, 6)))
        yield [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]


def _subsequence(part: str, text: str) -> bool:
    letters = iter(text)
    return all(letter in letters for letter in part)


class ReasoningParserContract(ComponentContract):
    """Every reasoning parser plugin must pass this. Subclass it and name the parser::

        class TestMyParser(ReasoningParserContract):
            reasoning_parser = "my_parser"

            def example_outputs(self):
                return ["<reason>why</reason>answer", ...]

    The parser is built as the server builds it, ``cls(tokenizer, chat_template_kwargs)``, for each
    of :meth:`chat_template_kwargs_cases`, and every one of :meth:`example_outputs` is split whole and
    streamed cut at every character boundary (and at random, with empty deltas): the streamed parts
    must join to the whole split.
    """

    kind = "reasoning_parser"
    interface = ReasoningParser
    reasoning_parser: ClassVar[str]
    """Registry name of the parser under test."""

    # -- hooks -----------------------------------------------------------------------------
    def tokenizer(self) -> Any:
        """The tokenizer the parser is built with: the embedded SmolLM2's unless overridden (a parser
        whose markers are special tokens of one model family should pass that family's)."""
        return embedded_tokenizer()

    def example_outputs(self) -> Sequence[str]:
        """Canned model outputs: :data:`OUTPUTS` (``<think>`` tags) unless overridden; include ones cut
        short inside a marker."""
        return OUTPUTS

    def chat_template_kwargs_cases(self) -> Sequence[dict[str, Any] | None]:
        """The requests' template variables the parser is built with in turn."""
        return [None, {"enable_thinking": True}, {"enable_thinking": False}]

    # -- helpers -----------------------------------------------------------------------------
    def parsers(self, component: type) -> Iterator[tuple[dict[str, Any] | None, ReasoningParser]]:
        for kwargs in self.chat_template_kwargs_cases():
            yield kwargs, component(self.tokenizer(), kwargs)

    # -- the contract --------------------------------------------------------------------------
    def test_whole_split_keeps_the_outputs_own_text(self, component):
        """Reasoning and content are taken from the output, in order (markers left out), and an empty
        part is None."""
        for kwargs, parser in self.parsers(component):
            for text in self.example_outputs():
                reasoning, content = parser.extract_reasoning(text)
                for what, part in (("reasoning", reasoning), ("content", content)):
                    if part == "":
                        violation(f"extract_reasoning({text!r}) gave an empty {what} string, not None ({kwargs=})")
                    if part is not None and not _subsequence(part, text):
                        violation(f"extract_reasoning({text!r}) gave {what} {part!r}, not text of the output")

    def test_streaming_equals_the_whole_split(self, component, seed):
        """However the output is cut into deltas, the streamed reasoning and content join to the whole
        split's."""
        rng = random.Random(seed)
        for kwargs, parser in self.parsers(component):
            for text in self.example_outputs():
                reasoning, content = parser.extract_reasoning(text)
                expected = (reasoning or "", content or "")
                for deltas in cuts(text, rng):
                    got = stream(parser, deltas)
                    if got != expected:
                        violation(
                            f"streamed as {deltas!r} ({kwargs=}), the output split into reasoning {got[0]!r} and "
                            f"content {got[1]!r}; whole, into {expected[0]!r} and {expected[1]!r}"
                        )

    def test_streams_keep_their_own_state(self, component):
        """Two parsers streaming two outputs at once (with whole splits asked in between) give what each
        gives alone: no state shared between parsers or touched by ``extract_reasoning``."""
        outputs = [t for t in self.example_outputs() if t]
        for kwargs in self.chat_template_kwargs_cases():
            first, second = component(self.tokenizer(), kwargs), component(self.tokenizer(), kwargs)
            for a, b in zip(outputs, outputs[1:] + outputs[:1], strict=True):
                parts: dict[int, list[tuple[str | None, str | None]]] = {0: [], 1: []}
                for i in range(max(len(a), len(b))):
                    for key, parser, text in ((0, first, a), (1, second, b)):
                        parts[key].append(parser.extract_reasoning_streaming(text[i : i + 1]))
                        parser.extract_reasoning(b if key == 0 else a)
                for key, parser, text in ((0, first, a), (1, second, b)):
                    parts[key].append(parser.finish_streaming())
                    alone = stream(component(self.tokenizer(), kwargs), list(text))
                    if _split(parts[key]) != alone:
                        violation(
                            f"{text!r} streamed beside {(b if key == 0 else a)!r} split into {_split(parts[key])!r}, "
                            f"alone into {alone!r} ({kwargs=}): parsers share state"
                        )

    def test_a_finished_parser_streams_a_new_output(self, component):
        """After :meth:`finish_streaming`, the next stream starts fresh."""
        outputs = self.example_outputs()
        for kwargs, parser in self.parsers(component):
            for before, text in zip(outputs, outputs[1:], strict=False):
                stream(parser, list(before))
                again, fresh = stream(parser, list(text)), stream(component(self.tokenizer(), kwargs), list(text))
                if again != fresh:
                    violation(
                        f"after streaming {before!r}, {text!r} split into {again!r}, in a new parser into {fresh!r} "
                        f"({kwargs=}): finish_streaming must reset the stream"
                    )

    def test_the_end_ids_end_the_reasoning(self, component):
        """``reasoning_end_token_ids`` are token ids of the tokenizer, and reasoning that ends with them
        has ended."""
        tokenizer = self.tokenizer()
        plain = tokenizer.encode("Let me think about it.", add_special_tokens=False)
        for kwargs, parser in self.parsers(component):
            end = list(parser.reasoning_end_token_ids)
            if not end or not all(isinstance(i, int) and 0 <= i < len(tokenizer) for i in end):
                violation(f"reasoning_end_token_ids is {end!r} ({kwargs=}): not a non-empty list of token ids")
            if not parser.is_reasoning_end(plain + end):
                violation(f"is_reasoning_end is False for reasoning followed by the end ids {end} ({kwargs=})")
