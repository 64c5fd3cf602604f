"""Prefix caching on the embedded SmolLM2: a shared system prompt, caching off vs on in one run.

Every request is a ``--prefix-len``-token system prompt followed by a short distinct suffix;
all arrive at once and generate ``--output-len`` greedy tokens. TTFT is measured from the
engine step loop: from the moment all requests are queued to the step that returns each
request's first token. Prints throughput, TTFT and the prefix cache hit rate side by side.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from kvserve import LLM, SamplingParams
from kvserve.loader import open_model

TOPICS = ["the ocean", "mountains", "a city at night", "rain", "the moon", "coffee", "trains", "libraries"]
SYSTEM_TEXT = (
    "You are a careful assistant for a public library. Answer briefly, cite the catalogue section when you can, "
    "never invent a book, and say so when you do not know. Opening hours are nine to five on weekdays. "
)


@dataclass
class Result:
    seconds: float
    prompt_tokens: int
    output_tokens: int
    ttft: list[float]
    hit_rate: float

    def row(self) -> list[str]:
        ttft = sorted(self.ttft)
        return [
            f"{self.seconds:.1f}",
            f"{self.output_tokens / self.seconds:.1f}",
            f"{(self.prompt_tokens + self.output_tokens) / self.seconds:.1f}",
            f"{statistics.mean(ttft):.2f}",
            f"{statistics.median(ttft):.2f}",
            f"{ttft[int(0.99 * (len(ttft) - 1))]:.2f}",
            f"{self.hit_rate:.1%}",
        ]


def workload(tokenizer, num_requests: int, prefix_len: int) -> list[list[int]]:
    system = tokenizer.encode(SYSTEM_TEXT * (prefix_len // 20 + 1), add_special_tokens=False)[:prefix_len]
    suffixes = [f"\nQuestion {i}: what do you have about {TOPICS[i % len(TOPICS)]}?" for i in range(num_requests)]
    return [system + tokenizer.encode(s, add_special_tokens=False) for s in suffixes]


def run(enable_prefix_caching: bool, prompts: list[list[int]], output_len: int, max_model_len: int) -> Result:
    llm = LLM(max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up, shares nothing
    stats_before = engine.kv_cache_manager.stats()

    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        engine.add_request(f"bench-{i}", engine.check_request(ids, params))
    ttft: dict[str, float] = {}
    output_tokens = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            ttft.setdefault(output.request_id, time.perf_counter() - start)
            if output.finished:
                output_tokens += len(output.outputs[0].token_ids)
    seconds = time.perf_counter() - start

    stats = engine.kv_cache_manager.stats()
    queries = stats.prefix_queries - stats_before.prefix_queries
    hits = stats.prefix_hits - stats_before.prefix_hits
    return Result(seconds, sum(map(len, prompts)), output_tokens, list(ttft.values()), hits / queries if queries else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-requests", type=int, default=128)
    parser.add_argument("--prefix-len", type=int, default=1000, help="tokens of the shared system prompt")
    parser.add_argument("--output-len", type=int, default=16)
    args = parser.parse_args()

    prompts = workload(open_model(None).tokenizer, args.num_requests, args.prefix_len)
    max_model_len = max(map(len, prompts)) + args.output_len
    results = {mode: run(mode == "on", prompts, args.output_len, max_model_len) for mode in ("off", "on")}

    suffix = statistics.mean(len(p) for p in prompts) - args.prefix_len
    print(
        f"workload: {args.num_requests} requests = {args.prefix_len}-token shared prefix + ~{suffix:.0f}-token "
        f"suffix, {args.output_len} output tokens each; SmolLM2-135M fp32, {torch.get_num_threads()} threads"
    )
    header = ["prefix caching", "seconds", "output tok/s", "total tok/s", "TTFT mean s", "TTFT p50 s", "TTFT p99 s"]
    rows = [header + ["hit rate"]] + [[mode] + result.row() for mode, result in results.items()]
    for row in rows:
        print(f"{row[0]:<16}" + "".join(f"{cell:>14}" for cell in row[1:]))
    off, on = results["off"], results["on"]
    print(
        f"speed-up with prefix caching: {off.seconds / on.seconds:.2f}x end to end, "
        f"{statistics.mean(off.ttft) / statistics.mean(on.ttft):.2f}x mean TTFT"
    )


if __name__ == "__main__":
    main()
