"""Offline throughput with tensor_parallel_size 1 vs 2 on this machine's CPU (gloo, fp32).

A locally built random Llama (the embedded SmolLM2's 9 query heads do not split over 2 ranks),
the same prompts and exactly ``--output-len`` greedy tokens each. TP=1 runs in this process with
the machine's torch threads; TP=2 runs two worker processes (``mp``) or two Ray actors on a local
Ray instance (``ray``, if installed) with one torch thread each, plus an all-reduce per
row-parallel layer (two per decoder layer) per step and the plan sent once per step (a pipe
each, or the Ray object store).
On a 2-core machine this measures the cost of tensor parallelism, not a speed-up. Also checks
that both produce the same tokens.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
from pathlib import Path

import torch

from kvserve import LLM, SamplingParams
from kvserve.benchmarking.offline import measure_throughput
from kvserve.testing.hf_models import build_tiny_model

MODEL = {
    "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 2048,
}  # fmt: skip
RUNS = {
    "TP=1": {"tensor_parallel_size": 1},
    "TP=2 mp": {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"},
    "TP=2 ray": {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model("llama", Path(tmp) / "llama", **MODEL)
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, MODEL["vocab_size"], (args.prompt_len,), generator=gen).tolist()
                   for _ in range(args.num_prompts)]  # fmt: skip
        results, tokens = {}, {}
        for name, parallel in RUNS.items():
            if name == "TP=2 ray" and importlib.util.find_spec("ray") is None:
                print("TP=2 ray: skipped, ray is not installed (pip install 'kvserve-core[ray]')")
                continue
            llm = LLM(str(path), dtype="float32", max_model_len=256, num_kv_blocks=512, **parallel)
            measure_throughput(llm, prompts[:2], 4, progress=False)  # warm-up
            results[name] = measure_throughput(llm, prompts, args.output_len, progress=False)
            outputs = llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
            tokens[name] = [o.outputs[0].token_ids for o in outputs]
            llm.engine.shutdown()
    print(f"model: llama {MODEL}, {args.num_prompts} prompts x {args.prompt_len} tokens, {args.output_len} out")
    print(f"torch threads in this process: {torch.get_num_threads()}; TP=2 workers: 1 thread each")
    for name, r in results.items():
        print(f"{name}: {r.seconds:.2f} s, {r.output_tokens / r.seconds:.1f} generated tok/s, "
              f"{(r.prompt_tokens + r.output_tokens) / r.seconds:.1f} total tok/s, "
              f"{results['TP=1'].seconds / r.seconds:.2f}x TP=1's throughput")  # fmt: skip
    print(f"same greedy tokens: {all(t == tokens['TP=1'] for t in tokens.values())}")


if __name__ == "__main__":
    main()
