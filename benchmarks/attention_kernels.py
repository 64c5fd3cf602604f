"""Attention kernel timings per backend on fixed decode and prefill batches.

On a CUDA machine it times every installed backend that serves the shape (triton, flash_attn,
flashinfer, ...) and names the ones that refuse, with their reasons; elsewhere it times the
platform's first-choice backend (on a CPU: ``cpu``, with its C++ kernel and, A/B, with its PyTorch
fallback). ``build_metadata`` (host planning, once per step) and ``forward`` (one layer) are timed
separately; ``forward`` as wall-clock and as this process's CPU time (steadier on a shared machine).

    python benchmarks/attention_kernels.py [--json out.json] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

import torch

from kvserve.interfaces import AttentionSpec, LayerAttentionSpec
from kvserve.plugins import get_plugin_manager, load_component
from kvserve.testing.attention_reference import build_batch

# cases: (phase, sequences, cached tokens each (an int, or (low, high) drawn per sequence), new tokens
# each); heads: (query heads, KV heads, head size). The CPU's are SmolLM2-135M's heads; its decode
# batch is the 32-sequence chat workload's; its prefills a 512-token chunk after 2,488 cached, and
# short and medium fresh prompts.
SHAPES = {
    "cuda": {
        "cases": [("decode", 64, 2048, 1), ("prefill", 4, 0, 1024)],
        "heads": (32, 8, 128),
        "dtype": "float16",
    },
    "cpu": {
        "cases": [
            ("decode", 32, (100, 500), 1),
            ("prefill", 1, 2488, 512),
            ("prefill", 16, 0, 16),
            ("prefill", 4, 0, 128),
        ],
        "heads": (9, 3, 64),
        "dtype": "bfloat16",
    },
}


def first_platform():
    """The first installed platform that can run here (as ``platform=auto`` chooses)."""
    reasons = []
    for name in get_plugin_manager().registry("platform").names():
        cls = load_component("platform", name)
        reason = cls.unavailable_reason()
        if reason is None:
            return cls()
        reasons.append(f"{name}: {reason}")
    raise SystemExit(f"no usable platform ({'; '.join(reasons)})")


def timed(fn, sync, iters: int) -> tuple[float, float]:
    """Median wall-clock and process-CPU milliseconds of ``fn`` over ``iters`` runs after two warm-ups."""
    for _ in range(2):
        fn()
    sync()
    wall, cpu = [], []
    for _ in range(iters):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        sync()
        wall.append((time.perf_counter() - start) * 1e3)
        cpu.append((time.process_time() - start_cpu) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def variants(cls) -> list[tuple[str, type]]:
    """``(kernel label, class)`` to time: the backend, plus its PyTorch fallback where it has a C++
    kernel that can be turned off (the ``cpu`` backend's ``native`` switch)."""
    if not getattr(cls, "native", False):
        return [("", cls)]
    return [("native", cls), ("pytorch", type(f"{cls.__name__}PyTorch", (cls,), {"native": False}))]


def bench_backend(cls, platform, shapes, iters: int) -> list[dict]:
    heads, kv_heads, head_dim = shapes["heads"]
    dtype = getattr(torch, shapes["dtype"])
    device = platform.device()
    spec = AttentionSpec(
        heads, kv_heads, head_dim, dtype, cls.default_block_size, device, layers=(LayerAttentionSpec(head_dim**-0.5),)
    )
    reasons = cls.unsupported_reasons(spec, platform)
    if reasons:
        return [{"backend": cls.name, "skipped": "; ".join(reasons)}]
    rows = []
    for phase, num_seqs, context, new in shapes["cases"]:
        gen = torch.Generator().manual_seed(0)
        contexts = (
            [context] * num_seqs
            if isinstance(context, int)
            else torch.randint(*context, (num_seqs,), generator=gen).tolist()
        )
        blocks_each = [-(-(c + new) // spec.block_size) for c in contexts]
        num_blocks = sum(blocks_each) + 1
        free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
        order = [[free.pop() for _ in range(n)] for n in blocks_each]
        batch = build_batch(order, contexts, [new] * num_seqs, spec.block_size, device)
        query = torch.randn(batch.num_tokens, heads, head_dim, generator=gen).to(dtype).to(device)
        for kernel, variant in variants(cls):
            backend = variant(spec)
            if getattr(backend, "fallback_reason", None) is not None:  # no C++ kernel here: say so
                kernel = "pytorch"
            (cache,) = backend.allocate_kv_cache(num_blocks)
            cache.normal_()
            metadata = backend.build_metadata(batch)
            forward_ms, forward_cpu_ms = timed(
                partial(backend.forward, query, cache, metadata, 0), platform.synchronize, iters
            )
            rows.append(
                {
                    "backend": cls.name,
                    "kernel": kernel,
                    "phase": phase,
                    "sequences": num_seqs,
                    "cached_tokens": context,
                    "new_tokens": new,
                    "block_size": spec.block_size,
                    "metadata_ms": timed(partial(backend.build_metadata, batch), platform.synchronize, iters)[0],
                    "forward_ms": forward_ms,
                    "forward_cpu_ms": forward_cpu_ms,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--dtype", help="instead of the platform's default (cuda: float16, cpu: bfloat16)")
    args = parser.parse_args()
    platform = first_platform()
    shapes = dict(SHAPES["cuda" if platform.device_type == "cuda" else "cpu"])
    if args.dtype:
        shapes["dtype"] = args.dtype
    results = {"platform": platform.name, "dtype": shapes["dtype"], "heads": shapes["heads"], "rows": []}
    if platform.device_type == "cuda":
        names = get_plugin_manager().registry("attention_backend").names()
    else:  # interpreters (Triton's on a CPU) would time nothing useful: the platform's first choice only
        names = list(platform.preferred_attention_backends[:1])
    for name in names:
        cls = load_component("attention_backend", name)
        if platform.device_type in cls.device_types:
            results["rows"] += bench_backend(cls, platform, shapes, args.iters)
    heads, kv_heads, head_dim = shapes["heads"]
    print(
        f"attention kernels on {platform.name}, {shapes['dtype']}, {heads}/{kv_heads} heads of {head_dim}, "
        f"{torch.get_num_threads()} threads"
    )
    for row in results["rows"]:
        if "skipped" in row:
            print(f"  {row['backend']:>12}  skipped: {row['skipped']}")
        else:
            cached = row["cached_tokens"]
            cached = f"{cached[0]}-{cached[1]}" if isinstance(cached, (list, tuple)) else cached
            shape = f"{row['sequences']} x ({cached} cached + {row['new_tokens']} new)"
            print(
                f"  {row['backend']:>12} {row['kernel']:<8} {row['phase']:<7} {shape:<28} forward "
                f"{row['forward_ms']:8.3f} ms ({row['forward_cpu_ms']:8.3f} ms CPU)"
                f"   build_metadata {row['metadata_ms']:7.3f} ms"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
