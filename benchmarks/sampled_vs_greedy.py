"""Sampled decoding against the same engine's greedy decoding, in one process, alternating rounds.

Loads a model once and runs ``--repeat`` rounds; each round makes one timed pass per mode — greedy,
``temperature=1.0``, and ``temperature=0.7, top_p=0.9`` — over the same workload (every request
generating exactly its ``max_new_tokens``, ``ignore_eos``), and prints each mode's median generated
tokens/s and its ratio to greedy. Only the public ``LLM`` API is used, so another checkout's engine is
measured by putting its ``src`` folders first on ``PYTHONPATH``.

    python benchmarks/sampled_vs_greedy.py MODEL --workload workload.json [--dtype bfloat16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

from kvserve import LLM, SamplingParams

MODES = {"greedy": {"temperature": 0.0}, "temperature=1.0": {"temperature": 1.0},
         "0.7/top_p=0.9": {"temperature": 0.7, "top_p": 0.9}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--workload", required=True, help="JSON: prompts (token-id lists), max_new_tokens (int)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    workload = json.load(open(args.workload))
    prompts, new = workload["prompts"], workload["max_new_tokens"]
    llm = LLM(args.model, dtype=args.dtype, max_model_len=max(512, max(map(len, prompts)) + new),
              max_num_seqs=len(prompts))  # fmt: skip
    llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=2), use_tqdm=False)  # warm-up
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    for round_ in range(args.repeat):
        for mode, fields in MODES.items():
            params = SamplingParams(**fields, max_tokens=new, min_tokens=new, ignore_eos=True, seed=None)
            llm.reset_prefix_cache()
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            rates[mode].append(tokens / seconds)
            print(f"round {round_} {mode:<16} {tokens / seconds:8.1f} tok/s", flush=True)
    greedy = statistics.median(rates["greedy"])
    print(f"\n{len(prompts)} prompts x {new} tokens, {args.dtype}, {os.environ.get('OMP_NUM_THREADS', '?')} threads, "
          f"{platform.processor() or platform.machine()}; {llm.engine.execution_summary()}")  # fmt: skip
    print(f"{'mode':<16} {'median tok/s':>12} {'/ greedy':>9}")
    for mode, values in rates.items():
        median = statistics.median(values)
        print(f"{mode:<16} {median:12.1f} {median / greedy:9.3f}")


if __name__ == "__main__":
    main()
