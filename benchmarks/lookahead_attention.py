"""What a multi-token decode query (1 + k tokens over a long context: speculative decoding's
verification step) costs the ``cpu`` backend's C++ kernel, against the k + 1 single-token decodes
it replaces and against one decode.

The kernel handles a query of several rows as a (short) prefill chunk and a single row as a
decode; this times both on SmolLM2-135M's heads (9 query, 3 KV, 64 wide), one layer, median
of ``--iters`` runs, as wall-clock and as this process's CPU time. On a loaded machine run it with
``OMP_NUM_THREADS=1``: two threads contending with other processes cost milliseconds a call.

Measured (2-core AVX-512 host, one thread, ms per layer, 1+4 query vs 5 decodes vs 1 decode):
bfloat16, 1 sequence over 1,024 / 2,048: 0.175 / 0.342 vs 0.194 / 0.386 vs 0.037 / 0.078; 32
sequences: 5.43 / 11.2 vs 6.69 / 14.2 vs 1.34 / 2.85. float32, 32 sequences: 6.06 / 13.3 vs
11.7 / 28.7 vs 2.31 / 5.59. A 5-row query rereads the keys and values per row: it costs 2.2-4.7x
one decode where a kernel reading them once for all rows would cost little more than one.

    python benchmarks/lookahead_attention.py [--dtype bfloat16] [--drafts 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from kvserve.interfaces import AttentionSpec, LayerAttentionSpec
from kvserve.plugins import load_component
from kvserve.testing.attention_reference import build_batch

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def timed_ms(fn: Callable[[], object], iters: int) -> tuple[float, float]:
    """Median wall-clock and process-CPU milliseconds of ``fn`` over ``iters`` runs after three warm-ups."""
    for _ in range(3):
        fn()
    wall, cpu = [], []
    for _ in range(iters):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - start) * 1e3)
        cpu.append((time.process_time() - start_cpu) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def step(backend, cache, contexts: list[int], new: int, block_tables: list[list[int]], gen) -> Callable[[], object]:
    """One layer's attention of ``new`` query tokens per sequence after ``contexts`` cached ones."""
    batch = build_batch(block_tables, contexts, [new] * len(contexts), backend.spec.block_size)
    query = torch.randn(batch.num_tokens, HEADS, HEAD_DIM, generator=gen).to(backend.spec.dtype)
    metadata = backend.build_metadata(batch)
    return partial(backend.forward, query, cache, metadata, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--drafts", type=int, default=4)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    cls = load_component("attention_backend", "cpu")
    spec = AttentionSpec(
        HEADS, KV_HEADS, HEAD_DIM, getattr(torch, args.dtype), cls.default_block_size, torch.device("cpu"),
        layers=(LayerAttentionSpec(HEAD_DIM**-0.5),),
    )  # fmt: skip
    backend = cls(spec)
    print(f"{backend.kernels()}; {args.dtype}, {torch.get_num_threads()} threads, block size {spec.block_size}")
    k = args.drafts
    print(f"{'seqs':>4} {'context':>7} | {'1+k query':>13} | {k + 1} decodes {'':>3} | {'1 decode':>13} | ratio (ms)")
    for num_seqs in (1, 8, 32):
        for context in (1024, 2048):
            gen = torch.Generator().manual_seed(0)
            per_seq = -(-(context + k + 1) // spec.block_size)
            tables = [list(range(1 + s * per_seq, 1 + (s + 1) * per_seq)) for s in range(num_seqs)]
            (cache,) = backend.allocate_kv_cache(1 + num_seqs * per_seq)
            cache.normal_()
            multi = timed_ms(step(backend, cache, [context] * num_seqs, 1 + k, tables, gen), args.iters)
            singles = [
                timed_ms(step(backend, cache, [context + j] * num_seqs, 1, tables, gen), args.iters)
                for j in range(k + 1)
            ]
            single_sum = (sum(w for w, _ in singles), sum(c for _, c in singles))
            print(
                f"{num_seqs:>4} {context:>7} | {multi[0]:6.3f} ({multi[1]:5.3f}) | {single_sum[0]:6.3f} "
                f"({single_sum[1]:5.3f}) | {singles[0][0]:6.3f} ({singles[0][1]:5.3f}) | "
                f"{multi[0] / single_sum[0]:.2f} of {k + 1} decodes, {multi[0] / singles[0][0]:.2f}x one"
            )


if __name__ == "__main__":
    main()
