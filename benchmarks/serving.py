"""Serving on the embedded SmolLM2: the kvserve server vs HF transformers, the same requests, one run.

All ``--num-prompts`` chat requests arrive at once and each generates exactly ``--output-len``
greedy tokens in fp32 (the same token ids everywhere):

- kvserve: ``kvserve serve`` in its own process, driven over HTTP with streamed
  ``/v1/completions`` (the load generator of ``kvserve bench serve``); times seen by the client.
- HF sequential: one ``generate`` per request in arrival order, as a simple server around
  transformers would run them; a request's latency includes its wait.
- HF batched: one padded ``generate`` of all requests (static batching, the offline best case:
  nobody gets a token before the whole batch has prefilled, nobody finishes before the batch).

Prints throughput, time to first token and latency side by side, and kvserve's ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import httpx
import torch

from harness.hf_baseline import Timing, hf_generate, hf_generate_sequential, load_hf_model
from kvserve.benchmarking.percentile import percentile
from kvserve.benchmarking.serving_client import run_serving_benchmark
from kvserve.benchmarking.workload import chat_prompt_ids
from kvserve.loader import open_model
from kvserve.testing.hf_models import embedded_hf_directory


def start_server(port: int) -> subprocess.Popen:
    # float32 and dequantized, as the HF baseline below: like for like.
    command = [sys.executable, "-m", "kvserve.cli", "serve", "--port", str(port), "--log-level", "warning"]
    command += ["--dtype", "float32", "--set", "quantization=none"]
    env = {**os.environ, "KVSERVE_LOG_LEVEL": "WARNING"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return process
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("kvserve serve did not come up")
        time.sleep(0.2)


def run_kvserve(prompt_ids: list[list[int]], output_len: int) -> tuple[float, list[Timing]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = start_server(port)
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(run_serving_benchmark(url, prompt_ids[:2], 4, progress=False))  # warm-up
        result = asyncio.run(run_serving_benchmark(url, prompt_ids, output_len, progress=False))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    assert len(result.completed) == len(prompt_ids) and all(r.output_tokens == output_len for r in result.completed)
    return result.duration, [Timing(r.ttft, r.latency) for r in result.completed]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=64)
    args = parser.parse_args()

    path = str(embedded_hf_directory())
    tokenizer = open_model(path).tokenizer
    prompt_ids = chat_prompt_ids(tokenizer, args.num_prompts)
    pad_id = tokenizer.pad_token_id or 0

    rows: dict[str, tuple[float, list[Timing]]] = {"kvserve server": run_kvserve(prompt_ids, args.output_len)}
    model = load_hf_model(path)
    hf_generate(model, prompt_ids[:2], 4, pad_id)  # warm-up
    sequential = hf_generate_sequential(model, prompt_ids, args.output_len, pad_id)
    rows["HF sequential"] = (sequential[-1].latency, sequential)
    batched = hf_generate(model, prompt_ids, args.output_len, pad_id)
    rows["HF batched (static)"] = (batched.latency, [batched] * len(prompt_ids))

    tokens = args.num_prompts * args.output_len
    print(
        f"workload: {args.num_prompts} requests at once x {args.output_len} output tokens, SmolLM2-135M fp32, "
        f"{torch.get_num_threads()} threads"
    )
    header = ("engine", "seconds", "req/s", "out tok/s", "mean TTFT s", "p99 TTFT s", "mean lat s", "p99 lat s")
    print(f"{header[0]:<22}" + "".join(f"{h:>13}" for h in header[1:]))
    for name, (seconds, timings) in rows.items():
        ttft, latency = [t.first_token for t in timings], [t.latency for t in timings]
        values = (
            seconds, args.num_prompts / seconds, tokens / seconds, statistics.fmean(ttft), percentile(ttft, 99),
            statistics.fmean(latency), percentile(latency, 99),
        )  # fmt: skip
        print(f"{name:<22}" + "".join(f"{v:>13.2f}" for v in values))
    kv_seconds, kv_timings = rows["kvserve server"]
    for name in ("HF sequential", "HF batched (static)"):
        seconds, timings = rows[name]
        print(
            f"kvserve / {name}: throughput {seconds / kv_seconds:.2f}x, "
            f"mean TTFT {_mean_ttft(kv_timings) / _mean_ttft(timings):.2f}x, "
            f"mean latency {_mean_latency(kv_timings) / _mean_latency(timings):.2f}x"
        )


def _mean_ttft(timings: list[Timing]) -> float:
    return statistics.fmean(t.first_token for t in timings)


def _mean_latency(timings: list[Timing]) -> float:
    return statistics.fmean(t.latency for t in timings)


if __name__ == "__main__":
    main()
