"""Start-up time with the embedded model (the goal: under 10 s), from a fresh process each time.

Two measurements, ``--repeat`` times each, with the CPU other processes used meanwhile:

Own CPU seconds are printed too: on a busy machine they say more than the wall time.

- ``kvserve generate --max-tokens 1 Hello`` (plus ``--kvserve-arg`` arguments): wall time from
  launching the command until it exits with its one token;
- the phases inside a fresh Python: ``import kvserve``, building ``LLM()`` (plus ``--kvserve-set``
  config), and generating the first token.

    python benchmarks/startup.py --kvserve-arg=-O1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from harness.cpu_usage import CpuWindow

PHASES = """
import json, sys, time
t0 = time.perf_counter()
import kvserve
from kvserve.config_sources import config_fields, parse_assignments
t1 = time.perf_counter()
llm = kvserve.LLM(**config_fields(None, parse_assignments(json.loads(sys.argv[1]))))
t2 = time.perf_counter()
llm.generate("Hello", kvserve.SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "build_s": t2 - t1, "first_token_s": t3 - t2, "total_s": t3 - t0}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kvserve-arg", action="append", default=[], help="extra `kvserve generate` argument")
    parser.add_argument("--kvserve-set", action="append", default=[], metavar="FIELD=VALUE", help="LLM() config")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), TOKENIZERS_PARALLELISM="false")

    cli, phases = [], []
    for _ in range(args.repeat):
        command = [sys.executable, "-m", "kvserve.cli", "generate", "--max-tokens", "1", *args.kvserve_arg, "Hello"]
        with CpuWindow() as cpu:
            done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"kvserve generate failed:\n{done.stderr[-2000:]}")
        cli.append(cpu.wall_s)
        print(
            f"kvserve generate: {cpu.wall_s:.2f}s to exit, own cpu {cpu.own_s:.1f}s (foreign cpu {cpu.foreign_s:.1f}s)",
            flush=True,
        )

        started = time.perf_counter()
        with CpuWindow() as cpu:
            done = subprocess.run(
                [sys.executable, "-c", PHASES, json.dumps(args.kvserve_set)], env=env, capture_output=True, text=True
            )
        if done.returncode != 0:
            raise SystemExit(f"LLM() start-up failed:\n{done.stderr[-2000:]}")
        phase = json.loads(done.stdout.strip().splitlines()[-1])
        phase["process_s"] = time.perf_counter() - started
        phases.append(phase)
        print(
            "in-process: "
            + ", ".join(f"{k} {v:.2f}" for k, v in phase.items())
            + f", own cpu {cpu.own_s:.1f}s (foreign cpu {cpu.foreign_s:.1f}s)",
            flush=True,
        )

    print(
        f"\nmedian of {args.repeat}: `kvserve generate` first token and exit {statistics.median(cli):.2f}s; "
        + ", ".join(f"{key} {statistics.median(p[key] for p in phases):.2f}s" for key in phases[0])
        + " (goal: under 10 s)"
    )


if __name__ == "__main__":
    main()
