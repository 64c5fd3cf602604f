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


def mixed_chat_prompt_ids(tokenizer: Any, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` chat prompts of mixed lengths, as token ids: a user question, after a seeded 0-3 earlier
    question/answer turns and sometimes a system prompt (tens to a few hundred tokens each)."""
    rng = random.Random(seed)
    asks = questions(len(ASKS) * len(TOPICS))
    answer = "Here is what I know about {}: it has a long history, many people care about it, and it keeps changing."
    prompts = []
    for i in range(count):
        messages = (
            [{"role": "system", "content": "You are a helpful, concise assistant."}] if rng.random() < 0.5 else []
        )
        for _ in range(rng.randrange(4)):
            topic = rng.choice(TOPICS)
            messages += [
                {"role": "user", "content": f"{rng.choice(asks)} Also, tell me about {topic}."},
                {"role": "assistant", "content": " ".join([answer.format(topic)] * rng.randrange(1, 4))},
            ]
        messages.append({"role": "user", "content": asks[i % len(asks)]})
        prompts.append(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        )
    return prompts
