"""Decode steps of several optimization levels, interleaved step by step in one process.

One engine per level (``-O``, repeatable; default 0 1 2) holds the same ``--batch`` greedy
sequences of ``--prompt-len`` seeded random token ids; after the prefill and ``--warmup`` decode
steps each (a compiled level compiles its bucket there), the engines take turns one decode step
at a time for ``--steps`` rounds. Interleaving single steps keeps the comparison fair on a busy
machine: a burst of foreign load hits every level alike, where whole passes one after the other
(``vs_peers.py``) see different loads. Per level it prints the median and fastest step, decode
tokens/s at the median, tokens per CPU second of this process (only one engine runs at a time),
the median over rounds of the step-time ratio to the first level, and whether the generated
tokens equal the first level's.

    python benchmarks/level_steps.py ~/.cache/kvserve-peers/models/llama-100m --dtype float32
    python benchmarks/level_steps.py --dtype bfloat16 -O 0 -O 1   # embedded SmolLM2
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from kvserve import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="HF model directory (default: the embedded SmolLM2)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("-O", dest="levels", type=int, action="append", help="optimization level (repeatable)")
    parser.add_argument("--batch", type=int, default=32, help="sequences decoding together")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3, help="decode steps per engine before timing")
    parser.add_argument("--steps", type=int, default=40, help="timed rounds (one decode step per engine each)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    levels = args.levels or [0, 1, 2]

    max_len = args.prompt_len + args.warmup + args.steps + 8
    blocks = args.batch * -(-max_len // 16) + 1
    engines = {}
    for level in levels:
        start = time.perf_counter()
        llm = LLM(
            args.model, dtype=args.dtype, optimization_level=level, max_num_seqs=args.batch,
            max_model_len=max(max_len, 128), num_kv_blocks=blocks,
        )  # fmt: skip
        engines[level] = llm.engine
        print(f"-O{level} loaded in {time.perf_counter() - start:.1f}s: {llm.engine.execution_summary()}", flush=True)
    rng = random.Random(args.seed)
    vocab = next(iter(engines.values())).hf_config.vocab_size
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(args.batch)]
    params = SamplingParams(temperature=0, max_tokens=max_len - args.prompt_len, ignore_eos=True)
    tokens: dict[int, dict[str, list[int]]] = {level: {} for level in levels}

    def step(level: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        outputs = engines[level].step()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        for out in outputs:
            tokens[level][out.request_id] = list(out.outputs[0].token_ids)
        return wall, cpu

    for level, engine in engines.items():
        for i, ids in enumerate(prompts):
            engine.add_request(str(i), engine.check_request(ids, params))
        start = time.perf_counter()
        while len(tokens[level]) < args.batch or any(not t for t in tokens[level].values()):
            step(level)  # the prefill (chunked where it must be)
        for _ in range(args.warmup):
            step(level)
        seconds = time.perf_counter() - start
        print(f"-O{level}: prefill and {args.warmup} warm-up steps in {seconds:.1f}s: {engine.execution_summary()}")

    times: dict[int, list[tuple[float, float]]] = {level: [] for level in levels}
    for _ in range(args.steps):
        for level in levels:
            times[level].append(step(level))

    first = levels[0]
    print(f"\n{args.model or 'SmolLM2'} {args.dtype}, batch {args.batch}, {args.steps} interleaved decode steps each")
    header = f"{'level':<7}{'median ms':>10}{'min ms':>8}{'tok/s':>8}{'tok/cpu-s':>10}{'step vs -O' + str(first):>13}"
    print(f"{header}  tokens")
    for level in levels:
        walls = [w for w, _ in times[level]]
        cpus = [c for _, c in times[level]]
        ratio = statistics.median(w / b for (w, _), (b, _) in zip(times[level], times[first], strict=True))
        same = sum(tokens[level][k] == tokens[first][k] for k in tokens[first])
        print(
            f"-O{level:<5}{statistics.median(walls) * 1e3:>10.1f}{min(walls) * 1e3:>8.1f}"
            f"{args.batch / statistics.median(walls):>8.0f}{args.batch / statistics.median(cpus):>10.0f}"
            f"{ratio:>13.2f}  {same}/{args.batch} = -O{first}"
        )


if __name__ == "__main__":
    main()
