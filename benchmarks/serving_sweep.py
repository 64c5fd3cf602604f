"""``kvserve serve`` under rising concurrency: throughput and latency percentiles per level, written as JSON.

Starts ``kvserve serve MODEL`` once (``--dtype``, ``--max-model-len 512``, as many sequences per batch as the
highest level), warms it up, then for each ``--concurrency`` level sends ``--requests-per-slot`` x level
streamed ``/v1/completions`` (the client of ``kvserve bench serve``), at most that many in flight, all
arriving at once. Prompts are the workload's token ids (cycled), each generating its ``max_new_tokens``
greedily with ``ignore_eos``, so every level does the same work per request. Per level it records the
throughput, TTFT/TPOT/ITL/end-to-end percentiles, every request's times, and the CPU seconds other
processes used meanwhile (``foreign_cpu_s``: the machine is shared when that is not ~0). The JSON also
names the machine (CPU model, cores, instruction sets), the versions and the command line;
``benchmarks/plot.py`` draws it.

    benchmarks/peers/setup.sh     # once: the model and workload in ~/.cache/kvserve-peers
    python benchmarks/serving_sweep.py ~/.cache/kvserve-peers/models/llama-100m \\
        --concurrency 1 --concurrency 4 --concurrency 16 --concurrency 32 --out docs/perf/serving_sweep.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import torch

import kvserve
from harness.cpu_usage import CpuWindow
from kvserve.benchmarking.serving_client import run_serving_benchmark

PEERS_DIR = Path(os.environ.get("KVSERVE_PEERS_DIR", Path.home() / ".cache/kvserve-peers"))
SERVED_NAME = "m"
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def machine() -> dict:
    """What a figure depends on: the CPU, its cores and instruction sets, the threads the engine may use."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "")
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return {
        "cpu": model or platform.processor(), "cores": os.cpu_count(), "isa": [f for f in ISA_FLAGS if f in flags],
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "python": platform.python_version(),
        "torch": torch.__version__, "kvserve": kvserve.__version__,
    }  # fmt: skip


def _quoted_with_tilde(arg: str) -> str:
    """``arg`` quoted for a shell, a path under the home folder as ``~/...`` so the command names no one's
    machine."""
    home = str(Path.home())
    if arg.startswith(home + "/"):
        return "~/" + shlex.quote(arg[len(home) + 1 :])
    return shlex.quote(arg)


def start_server(model: str, dtype: str, max_num_seqs: int, extra: list[str], log) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable, "-m", "kvserve.cli", "serve", model, "--port", str(port), "--dtype", dtype,
        "--max-model-len", "512", "--max-num-seqs", str(max_num_seqs), "--served-model-name", SERVED_NAME,
        "--log-level", "warning", *extra,
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"kvserve serve did not come up: {shlex.join(command)}")
        time.sleep(0.5)


def run_level(url: str, prompts: list[list[int]], output_len: int, concurrency: int, server_pid: int) -> dict:
    with CpuWindow(server_pid) as cpu:
        result = asyncio.run(
            run_serving_benchmark(
                url, prompts, output_len, model=SERVED_NAME, max_concurrency=concurrency, progress=False
            )
        )
    if len(result.completed) != len(prompts):
        first_error = next((r.error for r in result.results if r.error), "")
        raise RuntimeError(f"{len(prompts) - len(result.completed)} requests failed at {concurrency}: {first_error}")
    requests = [
        {"ttft_s": r.ttft, "latency_s": r.latency, "tpot_s": r.tpot, "output_tokens": r.output_tokens}
        for r in result.completed
    ]
    return {
        "concurrency": concurrency, "requests": len(prompts), "summary": result.summary(),
        "foreign_cpu_s": round(cpu.foreign_s, 1), "own_cpu_s": round(cpu.own_s, 1), "per_request": requests,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default=str(PEERS_DIR / "models/llama-100m"))
    parser.add_argument("--workload", default=str(PEERS_DIR / "workload.json"), help="prompts, max_new_tokens")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--concurrency", type=int, action="append", help="repeatable (default: 1, 4, 16, 32)")
    parser.add_argument("--requests-per-slot", type=int, default=2, help="requests per level = this x level")
    parser.add_argument("--min-requests", type=int, default=8)
    parser.add_argument("--kvserve-arg", action="append", default=[], help="extra `kvserve serve` argument")
    parser.add_argument("--out", default="serving_sweep.json")
    args = parser.parse_args()
    levels = sorted(set(args.concurrency or [1, 4, 16, 32]))
    workload = json.loads(Path(args.workload).read_text())
    output_len = workload["max_new_tokens"]
    if not isinstance(output_len, int):
        raise SystemExit(f"{args.workload}: max_new_tokens must be one integer for this benchmark")
    prompts = workload["prompts"]

    out = Path(args.out)
    with tempfile.NamedTemporaryFile("w", prefix="serving_sweep-", suffix=".log", delete=False) as log:
        print(f"server log: {log.name}", flush=True)
        server, url = start_server(args.model, args.dtype, max(levels), args.kvserve_arg, log)
        try:
            asyncio.run(run_serving_benchmark(url, prompts[:2], 8, model=SERVED_NAME, progress=False))  # warm-up
            runs = []
            for level in levels:
                count = max(args.min_requests, args.requests_per_slot * level)
                run = run_level(url, [prompts[i % len(prompts)] for i in range(count)], output_len, level, server.pid)
                summary = run["summary"]
                print(
                    f"concurrency {level:3d}: {count} requests, {summary['output_throughput']:7.1f} output tok/s, "
                    f"TTFT p50 {summary['p50_ttft_ms']:7.1f} ms p99 {summary['p99_ttft_ms']:7.1f} ms, "
                    f"TPOT p50 {summary['p50_tpot_ms']:6.1f} ms, foreign CPU {run['foreign_cpu_s']} s",
                    flush=True,
                )
                runs.append(run)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    report = {
        "benchmark": "serving_sweep", "engine": "kvserve serve", "model": Path(args.model).name,
        "dtype": args.dtype, "prompt_len": len(prompts[0]), "output_len": output_len,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
        "command": " ".join(["python", "benchmarks/serving_sweep.py", *map(_quoted_with_tilde, sys.argv[1:])]),
        "runs": runs,
    }  # fmt: skip
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
