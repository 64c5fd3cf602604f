"""A GGUF file in kvserve, kept in its GGML blocks (``quantization="gguf"``, kvserve-quant-gguf) and
dequantized at load (``quantization="none"``), against llama.cpp on the same file and threads.

Each kvserve mode runs in a fresh process (so neither warms the other's caches), bfloat16:

- start-up: building ``LLM`` on the ``.gguf`` file (parse, load, kernel build if not cached);
  ``-O 1``/``-O 2`` runs kvserve's compiled levels, their step shapes compiled in an untimed warm-up;
- one stream: one prompt of ``--prompt-len`` token ids, ``--tokens`` greedy tokens (``ignore_eos``);
- batch: ``--batch`` such prompts at once.

Rates are generated tokens per second over the whole ``generate`` call, prefill included, and (in
brackets) over its decode steps alone: the call's time less that of a call generating one token; each
time is the best of ``--repeat``. The prompts are random token ids of the model's vocabulary (seeded), as
llama.cpp's ``llama-batched-bench`` makes its own. With llama.cpp's tools (``benchmarks/peers/setup.sh`` with
``WITH_LLAMACPP=1``; ``--llamacpp`` names their folder), ``llama-batched-bench -npp PROMPT_LEN -ntg
TOKENS -npl 1,BATCH`` runs too, with ``-t``/``-tb`` the threads kvserve has, and each kvserve figure
gets its ratios to llama.cpp's: generated tokens over the whole run (``B·TG / T``, prefill included)
and decode alone (``S_TG``), each like for like. ``--rounds N`` runs every engine N times in turn (a
VM's speed drifts by 10-20% over minutes) and prints the median figures and each round's ratios.

Prints the CPU's name and the ISA flags that matter (avx512_vnni, avx512_bf16, amx). The machine's
other load is not controlled: run it on a quiet machine.

    python benchmarks/gguf_packed.py --tokens 128 --batch 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PEERS = Path(os.environ.get("KVSERVE_PEERS_DIR", Path.home() / ".cache/kvserve-peers"))
DEFAULT_LLAMACPP = PEERS / "llamacpp-build/bin"

RUN = """
import json, random, sys, time
from kvserve import LLM
from kvserve.benchmarking.offline import fixed_length_params
model, quantization, level, prompt_len, batch, tokens, repeat = json.loads(sys.argv[1])
start = time.perf_counter()
llm = LLM(model, quantization=quantization, dtype="bfloat16", max_model_len=512, optimization_level=level)
startup = time.perf_counter() - start
rng, vocab = random.Random(0), len(llm.get_tokenizer())
prompts = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(batch)]
# Warm-up: at a compiled level, the step shapes both cases run get compiled here, not while timed.
for warm in (prompts[:1], prompts):
    llm.generate(warm, fixed_length_params(4), use_tqdm=False)
def seconds(batch, count):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        llm.generate(batch, fixed_length_params(count), use_tqdm=False)
        best = min(best, time.perf_counter() - start)
    return best
def rates(batch):
    # The whole call, and its decode steps alone: the call less one that prefills and samples the first token.
    whole, first = seconds(batch, tokens), seconds(batch, 1)
    return len(batch) * tokens / whole, len(batch) * (tokens - 1) / (whole - first)
figures = {"startup_s": startup}
for name, batch in (("single", prompts[:1]), ("batch", prompts)):
    figures[f"{name}_tok_s"], figures[f"{name}_decode_tok_s"] = rates(batch)
print(json.dumps(figures))
"""


def measure(model: str, quantization: str, args: argparse.Namespace) -> dict[str, float]:
    """The figures of one fresh kvserve process."""
    sizes = [args.prompt_len, args.batch, args.tokens, args.repeat]
    spec = json.dumps([model, quantization, args.optimization_level, *sizes])
    out = subprocess.run([sys.executable, "-c", RUN, spec], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def batched_bench_rows(text: str) -> list[dict[str, float]]:
    """The rows of ``llama-batched-bench``'s table (``| PP | TG | B | N_KV | T_PP s | ... |``), by column."""
    lines = [line.strip().strip("|").split("|") for line in text.splitlines() if line.strip().startswith("|")]
    header = next((cells for cells in lines if "S_TG t/s" in [c.strip() for c in cells]), None)
    if header is None:
        raise SystemExit(f"llama-batched-bench printed no table:\n{text[-2000:]}")
    names = [c.strip() for c in header]
    rows = []
    for cells in lines:
        try:
            rows.append(dict(zip(names, (float(c) for c in cells), strict=True)))
        except ValueError:  # the header and the |---| rule
            continue
    return rows


def llamacpp(binaries: Path, model: str, args: argparse.Namespace, threads: int) -> dict[int, dict[str, float]]:
    """``llama-batched-bench`` at 1 and ``--batch`` sequences: per batch size, generated tokens/s over
    the whole run (``whole``) and over its decode phase (``decode``, llama.cpp's ``S_TG``)."""
    context = args.batch * (args.prompt_len + args.tokens) + 64
    command = [str(binaries / "llama-batched-bench"), "-m", model, "-c", str(context), "-b", "2048", "-ub", "512"]
    command += ["-npp", str(args.prompt_len), "-ntg", str(args.tokens), "-npl", f"1,{args.batch}"]
    command += ["-t", str(threads), "-tb", str(threads)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"llama-batched-bench failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return {
        int(row["B"]): {"whole": row["B"] * row["TG"] / row["T s"], "decode": row["S_TG t/s"]}
        for row in batched_bench_rows(out.stdout)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a .gguf file; default the embedded SmolLM2's")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2, help="each kvserve time is the best of this many calls")
    parser.add_argument(
        "--rounds", type=int, default=1, help="fresh processes of every engine in turn; medians and each round's ratios"
    )
    parser.add_argument("--modes", nargs="+", default=["gguf", "none"], help="kvserve quantization values")
    parser.add_argument(
        "-O", "--optimization-level", type=int, default=0, help="kvserve's (1, 2: compiled; warmed up untimed)"
    )
    parser.add_argument(
        "--llamacpp", type=Path, default=DEFAULT_LLAMACPP, help="llama.cpp's tools; skipped where absent"
    )
    args = parser.parse_args()
    from kvserve.loader.default_model import embedded_gguf_path
    from kvserve_cpu_native import cpu_name_and_flags

    model = args.model or str(embedded_gguf_path())
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count())
    name, flags = cpu_name_and_flags()
    isa = [flag for flag in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "avx2") if flag in flags]
    print(f"CPU: {name}; ISA: {' '.join(isa)}; threads: {threads}; {Path(model).name}; -O{args.optimization_level}")
    has_peer = (args.llamacpp / "llama-batched-bench").exists()
    if not has_peer:
        print(f"(no llama.cpp in {args.llamacpp}: WITH_LLAMACPP=1 benchmarks/peers/setup.sh builds it)")
    # Rounds alternate the engines, so a drift of the machine's speed reaches both alike; each ratio is
    # taken within its round and the table gives the medians.
    rounds = []
    for _ in range(args.rounds):
        results = {mode: measure(model, mode, args) for mode in args.modes}
        rounds.append((results, llamacpp(args.llamacpp, model, args, threads) if has_peer else None))

    medians = f", medians of {args.rounds} rounds" if args.rounds > 1 else ""
    sizes = f"{args.prompt_len}-token prompts, {args.tokens} generated tokens each"
    print(f"\n{sizes}; tokens/s whole (decode only){medians}")
    header = f"{'':<22}" + "".join(f"{'kvserve ' + mode:>22}" for mode in args.modes)
    print(header + (f"{'llama.cpp':>22}" if has_peer else ""))
    startup = [statistics.median(results[m]["startup_s"] for results, _ in rounds) for m in args.modes]
    print(f"{'start-up s':<22}" + "".join(f"{value:>22.1f}" for value in startup))
    for key, label, batch in [("single", "one stream", 1), ("batch", f"{args.batch} prompts", args.batch)]:
        ours = {
            m: [(results[m][f"{key}_tok_s"], results[m][f"{key}_decode_tok_s"]) for results, _ in rounds]
            for m in args.modes
        }
        line = f"{label + ' tok/s':<22}" + "".join(f"{pair(median_pair(runs)):>22}" for runs in ours.values())
        if has_peer:
            peers = [(peer[batch]["whole"], peer[batch]["decode"]) for _, peer in rounds]
            line += f"{pair(median_pair(peers)):>22}"
            for m, runs in ours.items():
                ratios = [(w / pw, d / pd) for (w, d), (pw, pd) in zip(runs, peers, strict=True)]
                whole, decode = median_pair(ratios)
                line += f"   {m} {whole:.2f}x ({decode:.2f}x)"
                if len(ratios) > 1:
                    line += " rounds: " + ", ".join(f"{w:.2f} ({d:.2f})" for w, d in ratios)
        print(line)


def median_pair(values: list[tuple[float, float]]) -> tuple[float, float]:
    """The median of each of the pairs' two figures."""
    return statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)


def pair(values: tuple[float, float]) -> str:
    return f"{values[0]:.1f} ({values[1]:.1f})"


if __name__ == "__main__":
    main()
