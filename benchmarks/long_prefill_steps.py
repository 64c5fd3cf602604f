"""Decode step times while long prompts arrive: does chunked prefill keep the p99 step under 2x the median?

``--decodes`` short requests decode ``--decode-len`` tokens each; after ``--arrive-after`` steps,
``--long`` prompts of ``--long-len`` random token ids arrive (the case it was written for: 4 prompts of ~3k
tokens while 28 sequences decode). Every ``LLMEngine.step`` is timed, and the scheduler's plan of
the step is recorded (a wrapper around ``scheduler.schedule``) to tell decode-only steps from
steps that also carry a prefill chunk. Reported over the steps that decode: median, p99, max,
p99/median; and the cost of a prefill token, from which the chunk size that keeps a mixed step
under 2x a decode-only one follows; and what the limits cost: the long prompts' time to first
token. ``--budget`` (repeatable) runs once per ``max_num_batched_tokens`` (the chunk budget),
``--threshold`` (repeatable) once per ``long_prefill_token_threshold`` (a per-request cap on a
step's chunk) and ``--slowdown`` (repeatable) once per ``max_decode_slowdown`` (a time-aware limit
on a step's prefill while requests decode); ``--kvserve-set FIELD=VALUE`` adds config. The engine
has the defaults of one that serves (``EngineConfig.for_serving``: ``max_decode_slowdown`` auto is 2).

    python benchmarks/long_prefill_steps.py                                 # embedded SmolLM2, as served
    python benchmarks/long_prefill_steps.py --slowdown 0 --threshold 0 --threshold 64   # without the time limit
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time

from kvserve import SamplingParams
from kvserve.benchmarking.percentile import percentile
from kvserve.config import EngineConfig
from kvserve.config_sources import config_fields, parse_assignments
from kvserve.engine.llm_engine import LLMEngine
from kvserve.scheduling.prefill_time_budget import split_tokens


def timed_steps(engine: LLMEngine, args: argparse.Namespace) -> tuple[list[tuple[float, int, int]], list[float]]:
    """(seconds, decode tokens, prefill tokens) of every step until all requests finish, and each
    long prompt's seconds from arrival to its first token."""
    plans = []
    schedule = engine.scheduler.schedule

    def recording_schedule():  # the plan is what tells a decode from a prefill chunk
        plan = schedule()
        plans.append(plan)
        return plan

    engine.scheduler.schedule = recording_schedule
    rng = random.Random(0)
    vocab = engine.hf_config.vocab_size

    def add(tag: str, count: int, length: int, new: int) -> None:
        params = SamplingParams(temperature=0.0, max_tokens=new, min_tokens=new, ignore_eos=True)
        for i in range(count):
            engine.add_request(f"{tag}{i}", engine.check_request([rng.randrange(vocab) for _ in range(length)], params))

    add("decode", args.decodes, args.short_len, args.decode_len)
    steps, first_tokens, arrived = [], {}, 0.0
    while engine.has_unfinished_requests():
        if len(steps) == args.arrive_after:
            add("long", args.long, args.long_len, 8)
            arrived = time.perf_counter()
        start = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - start
        for output in outputs:
            if output.request_id.startswith("long"):
                first_tokens.setdefault(output.request_id, time.perf_counter() - arrived)
        plan = plans[-1]
        prefill = split_tokens(plan)[1]
        steps.append((seconds, plan.num_batched_tokens - prefill, prefill))
    engine.scheduler.schedule = schedule
    return steps, sorted(first_tokens.values())


def report(label: str, steps: list[tuple[float, int, int]], first_tokens: list[float]) -> None:
    decoding = [s for s in steps if s[1] > 0]
    times = [s[0] * 1000 for s in decoding]
    mixed = [s for s in decoding if s[2] > 0]
    pure = [s[0] * 1000 for s in decoding if s[2] == 0]
    median, p99 = statistics.median(times), percentile(times, 99)
    print(
        f"{label}: {len(decoding)} decoding steps, median {median:.1f} ms, p99 {p99:.1f} ms, "
        f"max {max(times):.1f} ms, p99/median {p99 / median:.2f}x; long prompts' time to first token "
        + ", ".join(f"{t:.2f}" for t in first_tokens)
        + " s"
    )
    if mixed and pure:
        mixed_ms = statistics.median(s[0] * 1000 for s in mixed)
        chunk = statistics.median(s[2] for s in mixed)
        pure_median = statistics.median(pure)
        per_token = max(mixed_ms - pure_median, 1e-6) / chunk
        print(
            f"  {len(mixed)} steps carry a prefill chunk (median {chunk:.0f} tokens, {mixed_ms:.1f} ms) vs "
            f"{len(pure)} decode-only (median {pure_median:.1f} ms): p99 / decode-only median "
            f"{p99 / pure_median:.2f}x; {per_token:.3f} ms per prefill token, so a chunk of "
            f"<= {pure_median / per_token:.0f} tokens keeps a mixed step under 2x a decode-only one"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="HF model directory with >= 4k context (default: embedded SmolLM2)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--decodes", type=int, default=28)
    parser.add_argument("--short-len", type=int, default=32, help="prompt tokens of each decoding request")
    parser.add_argument("--decode-len", type=int, default=160)
    parser.add_argument("--long", type=int, default=4)
    parser.add_argument("--long-len", type=int, default=3000)
    parser.add_argument("--arrive-after", type=int, default=16, help="decode steps before the long prompts arrive")
    parser.add_argument("--budget", type=int, action="append", help="max_num_batched_tokens; repeatable")
    parser.add_argument(
        "--threshold", type=int, action="append", help="long_prefill_token_threshold (0: none); repeatable"
    )
    parser.add_argument(
        "--slowdown", action="append", help="max_decode_slowdown (0: off; default auto, as served); repeatable"
    )
    parser.add_argument("--kvserve-set", action="append", default=[], metavar="FIELD=VALUE")
    args = parser.parse_args()

    runs = itertools.product(args.budget or [2048], args.threshold or [0], args.slowdown or ["auto"])
    for budget, threshold, slowdown in runs:
        fields = {
            "dtype": args.dtype,
            "max_model_len": 4096,
            "max_num_batched_tokens": budget,
            "long_prefill_token_threshold": threshold,
            "max_decode_slowdown": slowdown,
        }
        assignments = {**fields, **parse_assignments(args.kvserve_set)}
        engine = LLMEngine(EngineConfig.from_flat(model=args.model, **config_fields(None, assignments)).for_serving())
        warm_up(engine)
        served = engine.config.scheduler.decode_slowdown()
        label = f"budget {budget:>5} threshold {threshold:>4} slowdown {slowdown}" + (
            f" ({served:g})" if slowdown == "auto" else ""
        )
        report(label, *timed_steps(engine, args))
        engine.shutdown()


def warm_up(engine: LLMEngine) -> None:
    engine.add_request("warm-up", engine.check_request([1] * 16, SamplingParams(temperature=0.0, max_tokens=4)))
    while engine.has_unfinished_requests():
        engine.step()


if __name__ == "__main__":
    main()
