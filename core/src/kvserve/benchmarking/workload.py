"""Benchmark prompts: short chat questions (realistic for an instruct model) or random token ids of a set length."""

from __future__ import annotations

import random
from typing import Any

TOPICS = ["the ocean", "mountains", "a city at night", "rain", "the moon", "coffee", "trains", "libraries"]
ASKS = ["Write a short poem about {}.", "Explain {} to a child.", "List three facts about {}.", "Describe {}."]


def questions(count: int) -> list[str]:
    """``count`` distinct-enough user questions, cycling through asks and topics."""
    return [ASKS[i % len(ASKS)].format(TOPICS[i % len(TOPICS)]) for i in range(count)]


def chat_prompt_ids(tokenizer: Any, count: int) -> list[list[int]]:
    """:func:`questions` through the tokenizer's chat template, as token ids."""
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for text in questions(count)
    ]


def random_prompt_ids(vocab_size: int, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of exactly ``length`` random token ids (a fixed input length, as ``vllm bench`` offers)."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(count)]
