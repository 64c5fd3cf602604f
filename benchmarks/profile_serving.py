"""Where ``kvserve serve``'s time goes under load: py-spy samples of every thread, summed by what they do.

Starts ``kvserve serve MODEL`` (bf16, 32 sequences, ``--max-model-len 512``, extra ``--serve-arg``s),
warms it up, then samples it with py-spy (``pip install py-spy``; non-blocking, all threads, idle
frames dropped) while 32 concurrent streamed ``/v1/completions`` of the workload run (the load of
``kvserve bench serve``; ``--kit`` adds the peers' non-streamed client). Prints, per thread, the
share of samples under each of a few buckets (the forward, sampling, scheduling, output processing,
the event loop's per-token work...), the top self-time frames, and writes the raw collapsed stacks
(``--out``, for speedscope or flamegraph.pl).

    python benchmarks/profile_serving.py ~/.cache/kvserve-peers/models/llama-100m \\
        --workload ~/.cache/kvserve-peers/workload.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from kvserve.benchmarking.serving_client import run_serving_benchmark

KIT = Path(__file__).with_name("peers")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BUCKETS = (  # (bucket, a substring of a frame "function (file)"); the first match from the leaf up wins
    ("forward", "model_runner.py"),
    ("forward", "torch/nn/modules"),
    ("sampling", "sampler.py"),
    ("scheduling", "kvserve_scheduler"),
    ("scheduling", "scheduler"),
    ("scheduling", "kv_cache"),
    ("output processing", "output_processor.py"),
    ("output processing", "detokenizer.py"),
    ("engine other", "llm_engine.py"),
    ("hand-off to the event loop", "deliver (kvserve/frontend/async_llm.py"),
    ("engine thread other", "step_loop.py"),
    ("engine thread other", "thread_client.py"),
    ("SSE chunks / JSON", "model_dump_json"),
    ("SSE chunks / JSON", "serving_completions.py"),
    ("SSE chunks / JSON", "serving_chat.py"),
    ("metrics", "metrics.py"),
    ("stream plumbing", "streaming.py"),
    ("stream plumbing", "async_llm.py"),
    ("HTTP (uvicorn/starlette)", "uvicorn"),
    ("HTTP (uvicorn/starlette)", "starlette"),
    ("HTTP (uvicorn/starlette)", "h11"),
    ("HTTP (uvicorn/starlette)", "httptools"),
    ("request parsing", "protocol.py"),
    ("request parsing", "pydantic"),
    ("event loop", "asyncio"),
)


def bucket(frames: list[str]) -> str:
    for frame in reversed(frames):  # leaf last in py-spy's raw format: search from the leaf
        for name, needle in BUCKETS:
            if needle in frame:
                return name
    return "other"


def summarize(raw: Path, top: int) -> None:
    """Per thread: samples by bucket (self time attributed to its innermost known frame) and top leaves."""
    threads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    leaves: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0].split(" ")[0] if frames[0].startswith("thread") else "process"
        body = frames[1:] if frames[0].startswith(("thread", "process")) else frames
        threads[frames[0]][bucket(body)] += int(count)
        leaves[frames[0]][body[-1] if body else "?"] += int(count)
        del thread
    for thread, counts in sorted(threads.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(counts.values())
        print(f"\n{thread}: {total} samples")
        for name, n in counts.most_common():
            print(f"  {100 * n / total:5.1f}%  {name}")
        print("  top self frames:")
        for frame, n in leaves[thread].most_common(top):
            print(f"    {100 * n / total:5.1f}%  {frame}")


def python_thread_names(py_spy: str, pid: int) -> dict[int, str]:
    """Native thread id -> Python thread name (py-spy dump); threads Python did not start are not in it."""
    out = subprocess.run([py_spy, "dump", "--pid", str(pid), "--json"], capture_output=True, text=True, check=True)
    return {t["os_thread_id"]: t.get("thread_name") or "?" for t in json.loads(out.stdout)}


def thread_cpu(pid: int, names: dict[int, str]) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of ``pid``, by Python thread name (others: "native" threads,
    the OpenMP pool's among them)."""
    seconds: dict[str, float] = collections.Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        name = names.get(int(task.name), "native (OpenMP pool, tokenizers, ...)")
        seconds[name] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return seconds


def report_cpu(load: str, before: dict[str, float], after: dict[str, float], tokens: int) -> None:
    print(f"server CPU ms per 1k output tokens under the {load} load, by thread ({tokens} tokens):")
    for name in sorted(after, key=lambda n: before.get(n, 0) - after[n]):
        print(f"  {1e6 * (after[name] - before.get(name, 0)) / tokens:8.0f}  {name}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--workload", required=True, help="JSON: prompts (token-id lists), max_new_tokens (int)")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra `kvserve serve` argument")
    parser.add_argument("--rounds", type=int, default=2, help="streamed bursts sampled")
    parser.add_argument("--kit", action="store_true", help="also sample the peers' non-streamed client's load")
    parser.add_argument("--spy", action="store_true", help="sample with py-spy (it takes CPU itself)")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples/s")
    parser.add_argument("--out", default="serving-profile.txt", help="raw collapsed stacks")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    workload = json.loads(Path(args.workload).read_text())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "kvserve.cli", "serve", args.model, "--port", str(port), "--dtype", "bfloat16"]
    command += ["--max-model-len", "512", "--max-num-seqs", "32", "--served-model-name", "m", "--log-level", "warning"]
    server = subprocess.Popen([*command, *args.serve_arg], stdout=subprocess.DEVNULL)
    try:
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
            if server.poll() is not None:
                raise SystemExit("the server exited during start-up")
        prompts, output_len = workload["prompts"], workload["max_new_tokens"]
        asyncio.run(run_serving_benchmark(url, prompts[:2], 8, "m", progress=False))  # warm-up
        spy = None
        if args.spy:
            spy_cmd = [py_spy, "record", "--pid", str(server.pid), "--rate", str(args.rate), "--threads"]
            spy_cmd += ["--nonblocking", "--format", "raw", "-o", args.out]
            spy = subprocess.Popen(spy_cmd, stdout=subprocess.DEVNULL)
            time.sleep(1.0)
        names = python_thread_names(py_spy, server.pid)
        before, tokens = thread_cpu(server.pid, names), 0
        for _ in range(args.rounds):
            result = asyncio.run(run_serving_benchmark(url, prompts, output_len, "m", progress=False))
            summary = result.summary()
            tokens += sum(r.output_tokens for r in result.completed)
            print(
                f"streamed burst: {summary['output_throughput']:.0f} tok/s, "
                f"TTFT p50 {summary['p50_ttft_ms']:.0f} ms, TPOT p50 {summary['p50_tpot_ms']:.1f} ms"
            )
        report_cpu("streamed", before, after := thread_cpu(server.pid, names), tokens)
        if args.kit:
            kit_cmd = [sys.executable, str(KIT / "bench_openai_client.py"), "--url", url, "--model", "m"]
            out = subprocess.run([*kit_cmd, "--workload", args.workload], capture_output=True, text=True, check=True)
            kit = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"kit client (non-streamed): {kit['gen_tok_per_s']:.0f} tok/s")
            report_cpu("kit client", after, thread_cpu(server.pid, names), kit["gen_tokens"])
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)
    if args.spy:
        summarize(Path(args.out), args.top)


if __name__ == "__main__":
    main()
