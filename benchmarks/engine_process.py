"""Served throughput and TTFT with the engine core on a thread vs in its own process.

Paired and alternating on one machine: for each round, each mode in turn starts
``kvserve serve MODEL --port PORT --dtype bfloat16 --max-model-len 512 --served-model-name m
[--engine-process]``, then runs the peers kit's non-streamed client (32 concurrent completions,
output tok/s) under ``peers/runmon.py`` (foreign CPU meanwhile), then ``kvserve bench serve`` (streamed, the
same 32 x 128 tokens: TTFT p50/p99), then stops the server. Prints one JSON line per run and the
medians per mode.

    python benchmarks/engine_process.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PEERS = Path(__file__).with_name("peers")  # the client and runmon.py
DATA = Path(os.environ.get("KVSERVE_PEERS_DIR", Path.home() / ".cache/kvserve-peers"))  # benchmarks/peers/setup.sh
KVSERVE = Path(sys.executable).with_name("kvserve")


def wait_healthy(url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
                return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not become healthy in {timeout}s")


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    url = f"http://127.0.0.1:{args.port}"
    command = [str(KVSERVE), "serve", args.model, "--port", str(args.port), "--dtype", "bfloat16",
               "--max-model-len", "512", "--served-model-name", "m", "--log-level", "warning",
               "--engine-process" if mode == "process" else "--no-engine-process"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(url)
        peers = subprocess.run(
            [sys.executable, str(PEERS / "runmon.py"), "--tree", str(server.pid), "--",
             sys.executable, str(PEERS / "bench_openai_client.py"), "--url", url, "--model", "m",
             "--workload", str(DATA / "workload.json")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        result = json.loads(peers.stdout.strip().splitlines()[-1])
        monitor = re.search(r"foreign_cpu_s=([\d.]+)", peers.stderr)
        streamed = subprocess.run(
            [str(KVSERVE), "bench", "serve", "--base-url", url, "--model", "m", "--num-prompts", "32",
             "--output-len", "128"],
            capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "200"},
        ).stdout  # fmt: skip
        ttft = re.search(r"TTFT \(ms\)\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│\s*([\d.]+)\s*│\s*([\d.]+)", streamed)
        tok = re.search(r"([\d.]+) output tok/s", re.sub(r"[\s│]+", " ", streamed))  # the caption wraps
        return {
            "mode": mode, "gen_tok_per_s": result["gen_tok_per_s"], "lat_mean_s": result["lat_mean_s"],
            "foreign_cpu_s": float(monitor.group(1)) if monitor else None,
            "streamed_tok_per_s": float(tok.group(1)) if tok else None,
            "ttft_p50_ms": float(ttft.group(2)) if ttft else None,
            "ttft_p99_ms": float(ttft.group(4)) if ttft else None,
        }  # fmt: skip
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DATA / "models" / "llama-100m"))
    parser.add_argument("--port", type=int, default=8021)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for round_ in range(args.rounds):
        for mode in ("thread", "process") if round_ % 2 == 0 else ("process", "thread"):
            runs.append(run_mode(mode, args))
            print(json.dumps(runs[-1]), flush=True)
    for mode in ("thread", "process"):
        mine = [r for r in runs if r["mode"] == mode]
        medians = {k: statistics.median(r[k] for r in mine) for k in mine[0] if k != "mode" and mine[0][k] is not None}
        print(json.dumps({"mode": mode, "median_of": len(mine), **medians}))


if __name__ == "__main__":
    main()
