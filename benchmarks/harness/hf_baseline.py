"""The HF transformers baseline: ``generate`` on the same prompts, as one padded batch or one request at a time."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers.generation.streamers import BaseStreamer


@dataclass
class Timing:
    """Seconds from a request's arrival to its first token and to its last."""

    first_token: float
    latency: float


class _FirstTokenClock(BaseStreamer):
    """A ``generate`` streamer: it is handed the prompt first, then each new token, so its second call is
    the moment the first token exists."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_token_at = 0.0

    def put(self, value: torch.Tensor) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


def load_hf_model(path: str) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_generate(model: Any, prompt_ids: list[list[int]], output_len: int, pad_id: int) -> Timing:
    """One left-padded batch of every prompt, exactly ``output_len`` greedy tokens each (HF's fastest
    offline mode); every request in it sees the same timing."""
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompt_ids], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=model.device)
    clock = _FirstTokenClock()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, do_sample=False, streamer=clock,
            max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=pad_id,
        )  # fmt: skip
    end = time.perf_counter()
    assert out.shape[1] == width + output_len
    return Timing(clock.first_token_at - start, end - start)


def hf_generate_batched(model: Any, prompt_ids: list[list[int]], output_len: int, pad_id: int) -> float:
    """Seconds for :func:`hf_generate` over all prompts at once."""
    return hf_generate(model, prompt_ids, output_len, pad_id).latency


def hf_generate_sequential(model: Any, prompt_ids: list[list[int]], output_len: int, pad_id: int) -> list[Timing]:
    """Each request's timing when all arrive at once and are served one after another
    (what a naive server around ``generate`` does): its wait counts."""
    start = time.perf_counter()
    timings = []
    for prompt in prompt_ids:
        waited = time.perf_counter() - start
        own = hf_generate(model, [prompt], output_len, pad_id)
        timings.append(Timing(waited + own.first_token, waited + own.latency))
    return timings
