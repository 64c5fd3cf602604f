"""Where kvserve's offline decode spends its time: torch.profiler over ``LLM.generate``.

Runs the peers' workload (``--workload``: JSON with ``prompts`` as token-id lists and
``max_new_tokens``, an int or one per prompt; ``benchmarks/peers/make_workload.py`` writes it, and
``vs_peers.py`` writes its chat mix as ``workload.json`` in its log folder) greedily with ``ignore_eos``
after a warm-up, and prints the top operators by self CPU time with their share of the total.

    python benchmarks/profile_decode.py MODEL_DIR --dtype bfloat16 --workload workload.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from kvserve import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="override the workload's")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--trace", default=None, help="also write a Chrome trace here")
    args = parser.parse_args()

    workload = json.load(open(args.workload))
    new_tokens = args.max_new_tokens or workload["max_new_tokens"]
    if isinstance(new_tokens, int):
        new_tokens = [new_tokens] * len(workload["prompts"])
    llm = LLM(args.model, dtype=args.dtype, max_model_len=512, max_num_seqs=len(workload["prompts"]))
    params = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True) for n in new_tokens]
    llm.generate(workload["prompts"][:2], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    llm.reset_prefix_cache()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        outputs = llm.generate(workload["prompts"], params, use_tqdm=False)
        seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(
        f"{args.dtype}: {len(outputs)} prompts, {generated} tokens in {seconds:.2f}s under the profiler "
        f"({generated / seconds:.0f} tok/s), {torch.get_num_threads()} threads"
    )
    print(f"{'op':<44}{'self ms':>10}{'share':>8}{'calls':>9}")
    for event in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[: args.top]:
        share = event.self_cpu_time_total / total
        print(f"{event.key[:43]:<44}{event.self_cpu_time_total / 1e3:>10.1f}{share:>8.1%}{event.count:>9}")
    if args.trace:
        prof.export_chrome_trace(args.trace)


if __name__ == "__main__":
    main()
