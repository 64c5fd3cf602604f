"""Load on a running OpenAI-compatible server: streamed completions at a request rate, timed per token.

Like ``vllm bench serve``: requests arrive as a Poisson process (or all at once), each
streams ``/v1/completions`` with a fixed output length, and the report gives time to first
token (TTFT), time per output token after the first (TPOT), inter-token latency (ITL) and
throughput.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from kvserve.benchmarking.percentile import percentile
from kvserve.extras import requires_extra

with requires_extra("server", "the serving benchmark client"):
    import httpx

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first; None for a single token."""
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


@dataclass
class ServingResult:
    results: list[RequestResult]
    duration: float

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.results if r.ok]

    def summary(self) -> dict[str, float]:
        """Throughput, plus mean and percentiles (ms) of TTFT, TPOT, ITL and end-to-end latency."""
        done = self.completed
        output = sum(r.output_tokens for r in done)
        prompt = sum(r.prompt_tokens for r in done)
        summary = {
            "completed": len(done),
            "failed": len(self.results) - len(done),
            "duration_s": self.duration,
            "request_throughput": len(done) / self.duration,
            "output_throughput": output / self.duration,
            "total_token_throughput": (prompt + output) / self.duration,
        }
        samples = {
            "ttft": [r.ttft for r in done],
            "tpot": [t for r in done if (t := r.tpot) is not None],
            "itl": [gap for r in done for gap in r.itl],
            "e2el": [r.latency for r in done],
        }
        for name, values in samples.items():
            summary[f"mean_{name}_ms"] = 1000 * statistics.fmean(values) if values else math.nan
            for p in PERCENTILES:
                summary[f"p{p}_{name}_ms"] = 1000 * percentile(values, p)
        return summary


async def _one_request(
    client: httpx.AsyncClient, model: str | None, prompt: str | list[int], output_len: int, sampling: dict[str, Any]
) -> RequestResult:
    body = {
        "model": model, "prompt": prompt, "max_tokens": output_len, **sampling, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    result = RequestResult(ok=False)
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                now = time.perf_counter()
                if chunk["choices"]:  # one chunk per generated token
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.latency = time.perf_counter() - start
    result.ok = True
    return result


async def run_serving_benchmark(
    base_url: str,
    prompts: list[str] | list[list[int]],
    output_len: int,
    model: str | None = None,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    api_key: str | None = None,
    seed: int = 0,
    progress: bool = True,
    sampling: dict[str, Any] | None = None,
) -> ServingResult:
    """Send every prompt once; ``request_rate`` requests/s on average (inf: all at once). ``sampling``:
    the requests' sampling fields (e.g. ``{"temperature": 0.7, "top_p": 0.9}``); None: greedy."""
    sampling = {"temperature": 0} if sampling is None else sampling
    rng = random.Random(seed)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limit = asyncio.Semaphore(max_concurrency or len(prompts))
    bar = tqdm(total=len(prompts), desc="Requests", unit="req", disable=not progress)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=None, limits=limits) as client:

        async def send(prompt: str | list[int]) -> RequestResult:
            async with limit:
                result = await _one_request(client, model, prompt, output_len, sampling)
            bar.update(1)
            return result

        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(send(prompt)))
            if request_rate != math.inf:
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    bar.close()
    return ServingResult(list(results), duration)
