"""Offline benchmarks over ``LLM``: throughput of one large batch, and latency of a fixed batch."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tqdm.auto import tqdm

from kvserve.entrypoints.llm import LLM
from kvserve.sampling_params import SamplingParams


@dataclass
class ThroughputResult:
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    seconds: float

    @property
    def requests_per_second(self) -> float:
        return self.num_requests / self.seconds

    @property
    def output_tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def total_tokens_per_second(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.seconds


def fixed_length_params(output_len: int) -> SamplingParams:
    """Greedy, exactly ``output_len`` tokens: every engine in a comparison does the same work."""
    return SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)


def measure_throughput(
    llm: LLM, prompt_ids: list[list[int]], output_len: int, progress: bool = True
) -> ThroughputResult:
    """All prompts submitted at once; continuous batching does the rest."""
    start = time.perf_counter()
    outputs = llm.generate(prompt_ids, fixed_length_params(output_len), use_tqdm=progress)
    seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return ThroughputResult(len(prompt_ids), sum(len(p) for p in prompt_ids), generated, seconds)


def measure_latency(
    llm: LLM, prompt_ids: list[list[int]], output_len: int, num_iters: int, warmup_iters: int = 1
) -> list[float]:
    """Seconds to finish the whole batch ``prompt_ids``, once per iteration after the warm-up ones."""
    params = fixed_length_params(output_len)
    for _ in range(warmup_iters):
        llm.generate(prompt_ids, params, use_tqdm=False)
    latencies = []
    for _ in tqdm(range(num_iters), desc="Measuring latency", unit="iter"):
        start = time.perf_counter()
        llm.generate(prompt_ids, params, use_tqdm=False)
        latencies.append(time.perf_counter() - start)
    return latencies
