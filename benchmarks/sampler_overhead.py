"""Sampler cost per decode step, as a fraction of the step, for what users send.

Runs a model (default: the embedded SmolLM2) with ``--batch`` concurrent requests in each of four
modes — greedy, ``temperature=1.0``, ``temperature=0.7, top_p=0.9``, and every feature at once
(penalties, top-k/top-p/min-p, logit bias, bad words, a seed and top-5 logprobs) — times every decode
step and the sampler call inside it, and prints both side by side with their ratio.

    python benchmarks/sampler_overhead.py [MODEL] [--batch 32] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import time

import torch

from kvserve import LLM, SamplingParams


class TimedSampler:
    """Wraps the engine's sampler to add up the time spent in it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.seconds = 0.0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        result = self.inner(*args, **kwargs)
        self.seconds += time.perf_counter() - start
        return result

    def __getattr__(self, name: str):
        return getattr(self.inner, name)  # accept, forget, ...: the engine's sampler's own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", help="HF model directory (default: the embedded SmolLM2)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()

    llm = LLM(args.model, max_model_len=512, dtype=args.dtype, max_num_seqs=args.batch)
    engine = llm.engine
    full = SamplingParams(
        temperature=0.8, top_k=50, top_p=0.9, min_p=0.02, presence_penalty=0.5, frequency_penalty=0.3,
        repetition_penalty=1.1, logit_bias={42: 2.0}, bad_words=["banana"], logprobs=5, seed=7,
        max_tokens=args.steps + 1, ignore_eos=True,
    )  # fmt: skip
    plain = full.model_copy(update=dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, presence_penalty=0.0,
                                        frequency_penalty=0.0, repetition_penalty=1.0, logit_bias={},
                                        bad_words=[], logprobs=None, seed=None))  # fmt: skip
    modes = (
        ("greedy", plain),
        ("temperature=1.0", plain.model_copy(update={"temperature": 1.0})),
        ("0.7/top_p=0.9", plain.model_copy(update={"temperature": 0.7, "top_p": 0.9})),
        ("all features", full),
    )
    for label, params in modes:
        for i in range(args.batch):
            seeded = params.model_copy(update={"seed": None if params.seed is None else i})
            engine.add_request(f"{label}-{i}", engine.check_request([1] + list(range(100, 130 + i % 7)), seeded))
        while any(not s.request.output_token_ids for s in engine.states.values()):
            engine.step()  # prefill everything first: only decode steps are measured
        timed = engine.sampler = TimedSampler(engine.sampler)
        start = time.perf_counter()
        for _ in range(args.steps - 1):
            engine.step()
        step_seconds = (time.perf_counter() - start) / (args.steps - 1)
        sampler_seconds = timed.seconds / (args.steps - 1)
        engine.sampler = timed.inner
        while engine.has_unfinished_requests():
            engine.step()
        print(f"{label:<16} batch {args.batch}: step {step_seconds * 1e3:7.1f} ms, "
              f"sampler {sampler_seconds * 1e3:6.1f} ms, sampler/step = {sampler_seconds / step_seconds:.1%} "
              f"({torch.get_num_threads()} threads)")  # fmt: skip


if __name__ == "__main__":
    main()
