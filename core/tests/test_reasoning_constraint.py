"""A structured-output constraint held off until the reasoning ends (``constrain_after_reasoning``), over a
small real grammar and the embedded SmolLM2 tokenizer's ids for ``</think>`` (it has no such token: the
tag is three tokens, ``</``, ``think``, ``>``)."""

from __future__ import annotations

import pytest
import torch

from kvserve.interfaces.logits_constraint import LogitsConstraint, bitmask_words
from kvserve.reasoning import DeepSeekR1ReasoningParser, Qwen3ReasoningParser, constrain_after_reasoning
from kvserve.reasoning.constraint import ReasoningGatedConstraint
from kvserve.testing.contracts.reasoning_parser import embedded_tokenizer


class ExactTokens(LogitsConstraint):
    """A grammar of one sentence: exactly ``tokens``, in order, then nothing. Records what it was told."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.position = 0
        self.accepted: list[int] = []

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        bitmask[row].zero_()
        if self.position < len(self.tokens):
            word, bit = divmod(self.tokens[self.position], 32)
            bitmask[row, word] = (1 << bit) - (1 << 32 if bit == 31 else 0)  # as an int32

    def accept_tokens(self, token_ids: list[int]) -> bool:
        for token in token_ids:
            if self.position >= len(self.tokens) or token != self.tokens[self.position]:
                return False
            self.position += 1
            self.accepted.append(token)
        return True

    def rollback(self, num_tokens: int) -> None:
        self.position -= num_tokens
        del self.accepted[len(self.accepted) - num_tokens :]

    def is_terminated(self) -> bool:
        return self.position == len(self.tokens)

    def reset(self) -> None:
        self.position = 0
        self.accepted.clear()


@pytest.fixture(scope="module")
def tokenizer():
    return embedded_tokenizer()


@pytest.fixture
def ids(tokenizer):
    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    return encode


def allowed(constraint: LogitsConstraint, vocab: int) -> set[int]:
    """The tokens ``constraint`` allows next, read back from a bitmask row it filled."""
    bitmask = torch.full((2, bitmask_words(vocab)), 0x5A5A5A5A, dtype=torch.int32)  # garbage before
    constraint.fill_bitmask(bitmask, 1)
    bits = [(int(word) >> bit) & 1 for word in bitmask[1] for bit in range(32)]
    return {token for token, bit in enumerate(bits[:vocab]) if bit}


def test_the_matcher_is_left_alone_without_a_parser_or_when_the_prompt_ended_the_reasoning(tokenizer, ids):
    matcher = ExactTokens(ids("4"))
    prompt = ids("<|im_start|>assistant\n")
    assert constrain_after_reasoning(matcher, None, prompt) is matcher
    off = Qwen3ReasoningParser(tokenizer, {"enable_thinking": False})
    assert constrain_after_reasoning(matcher, off, prompt) is matcher
    closed_in_prompt = prompt + ids("<think>\n\n</think>\n\n")  # Qwen3's template with thinking off
    assert constrain_after_reasoning(matcher, Qwen3ReasoningParser(tokenizer), closed_in_prompt) is matcher
    opened_in_prompt = prompt + ids("<think>\n")  # DeepSeek R1's template
    gated = constrain_after_reasoning(matcher, DeepSeekR1ReasoningParser(tokenizer), opened_in_prompt)
    assert isinstance(gated, ReasoningGatedConstraint) and gated.inner is matcher


def test_reasoning_runs_free_and_the_grammar_starts_after_its_end(tokenizer, ids):
    answer = ids('{"answer": 4}')
    inner = ExactTokens(answer)
    gated = constrain_after_reasoning(inner, DeepSeekR1ReasoningParser(tokenizer), ids("<think>\n"))
    vocab = len(tokenizer)
    assert allowed(gated, vocab) == set(range(vocab))
    reasoning = ids("Two and two: 4. Not </ this, nor think>.") + [tokenizer.eos_token_id]
    assert gated.accept_tokens(reasoning) and not gated.is_terminated() and not gated.reasoning_ended
    assert allowed(gated, vocab) == set(range(vocab)) and inner.accepted == []
    # The end tag and the answer's first two tokens in one step: the grammar sees only the answer's.
    assert gated.accept_tokens(ids("\n</think>") + answer[:2])
    assert gated.reasoning_ended and inner.accepted == answer[:2]
    assert allowed(gated, vocab) == {answer[2]}
    assert not gated.accept_tokens([answer[0]])  # the grammar refuses: the request fails
    assert inner.accepted == answer[:2]


def test_the_end_tag_may_come_over_several_steps(tokenizer, ids):
    end = list(DeepSeekR1ReasoningParser(tokenizer).reasoning_end_token_ids)
    assert len(end) == 3  # SmolLM2 spells it </ think >
    inner = ExactTokens(ids("4"))
    gated = ReasoningGatedConstraint(inner, end)
    for token in end[:-1]:
        assert gated.accept_tokens([token]) and not gated.reasoning_ended
    assert gated.accept_tokens([end[-1]]) and gated.reasoning_ended and inner.accepted == []
    assert gated.accept_tokens(ids("4")) and gated.is_terminated()


def test_rollback_across_the_reasoning_end_reopens_the_reasoning(tokenizer, ids):
    end = list(DeepSeekR1ReasoningParser(tokenizer).reasoning_end_token_ids)
    answer = ids('{"answer": 4}')
    inner = ExactTokens(answer)
    gated = ReasoningGatedConstraint(inner, end)
    assert gated.accept_tokens(ids("so 4") + end + answer[:2])
    gated.rollback(1)  # a rejected draft of the answer
    assert inner.accepted == answer[:1] and gated.reasoning_ended
    gated.rollback(2)  # the answer's first token and the end tag's last
    assert inner.accepted == [] and not gated.reasoning_ended
    assert allowed(gated, len(tokenizer)) == set(range(len(tokenizer)))
    assert gated.accept_tokens([end[-1], *answer]) and inner.accepted == answer and gated.is_terminated()
    with pytest.raises(ValueError, match="cannot roll back 99 tokens: only"):
        gated.rollback(99)


def test_reset_starts_over_in_the_reasoning(tokenizer, ids):
    end = list(Qwen3ReasoningParser(tokenizer).reasoning_end_token_ids)
    inner = ExactTokens(ids("4"))
    gated = ReasoningGatedConstraint(inner, end)
    assert gated.accept_tokens(end + ids("4")) and gated.is_terminated()
    gated.reset()
    assert not gated.reasoning_ended and not gated.is_terminated() and inner.accepted == []
    assert gated.accept_tokens(ids("4")) and inner.accepted == []  # reasoning again: not the grammar's
    with pytest.raises(ValueError, match="end_token_ids"):
        ReasoningGatedConstraint(inner, [])
