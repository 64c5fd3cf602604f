"""The HF transformers baseline: ``generate`` on the same prompts, as one padded batch or one request at a time."""

from __future__ import annotations

import time
from typing import Any

import torch


def load_hf_model(path: str) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def hf_generate_batched(model: Any, prompt_ids: list[list[int]], output_len: int, pad_id: int) -> float:
    """Seconds for one left-padded batch of every prompt, exactly ``output_len`` greedy tokens each
    (HF's fastest offline mode)."""
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, do_sample=False,
            max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=pad_id,
        )  # fmt: skip
    elapsed = time.perf_counter() - start
    assert out.shape[1] == width + output_len
    return elapsed


def hf_generate_sequential(model: Any, prompt_ids: list[list[int]], output_len: int, pad_id: int) -> list[float]:
    """Each request's latency when all arrive at once and are served one after another
    (what a naive server around ``generate`` does)."""
    start = time.perf_counter()
    latencies = []
    for prompt in prompt_ids:
        hf_generate_batched(model, [prompt], output_len, pad_id)
        latencies.append(time.perf_counter() - start)
    return latencies
