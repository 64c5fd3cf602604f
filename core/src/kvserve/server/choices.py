"""A request's choices assembled from the engine's delta outputs, numbered as OpenAI numbers them."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.outputs import CompletionOutput, RequestOutput, TokenLogprobs
from kvserve.server.protocol import UsageInfo


@dataclass
class Choice:
    """One completion so far; choice ``index`` is ``prompt_index * n + completion index``."""

    index: int
    prompt_index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_chars: int = 0
    """Characters already streamed to the client (an echoed prompt included)."""


class Choices:
    """Every choice of a request, the prompts' logprobs, and the usage so far."""

    def __init__(self, prompt_lengths: list[int], n: int) -> None:
        self.prompt_lengths = prompt_lengths
        self.n = n
        self.choices = [Choice(p * n + i, p) for p in range(len(prompt_lengths)) for i in range(n)]
        self.prompt_logprobs: dict[int, list[TokenLogprobs | None]] = {}

    def add(self, prompt_index: int, output: RequestOutput) -> list[tuple[Choice, CompletionOutput]]:
        """Fold one delta output in; returns each changed choice with its delta."""
        if output.prompt_logprobs is not None:
            self.prompt_logprobs[prompt_index] = output.prompt_logprobs  # sent once, with the first delta
        changed = []
        for delta in output.outputs:
            choice = self.choices[prompt_index * self.n + delta.index]
            choice.text += delta.text
            choice.token_ids += delta.token_ids
            choice.logprobs += delta.logprobs or []
            choice.finish_reason, choice.stop_reason = delta.finish_reason, delta.stop_reason
            changed.append((choice, delta))
        return changed

    def usage(self) -> UsageInfo:
        prompt = sum(self.prompt_lengths)
        completion = sum(len(c.token_ids) for c in self.choices)
        return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
