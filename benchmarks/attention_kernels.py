"""Attention kernel timings per backend on one fixed decode batch and one fixed prefill batch.

On a CUDA machine it times every installed backend that serves the shape (triton, flash_attn,
flashinfer, ...) and names the ones that refuse, with their reasons; elsewhere it times the
platform's first-choice backend (on a CPU: ``cpu``). ``build_metadata``
(host planning, once per step) and ``forward`` (one layer) are timed separately.

    python benchmarks/attention_kernels.py [--json out.json]
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

# (sequences, cached tokens each, new tokens each), and (query heads, KV heads, head size)
SHAPES = {
    "cuda": {"decode": (64, 2048, 1), "prefill": (4, 0, 1024), "heads": (32, 8, 128), "dtype": "float16"},
    "cpu": {"decode": (8, 512, 1), "prefill": (2, 0, 128), "heads": (8, 2, 64), "dtype": "float32"},
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


def timed(fn, sync, iters: int) -> float:
    """Median milliseconds of ``fn`` over ``iters`` runs after two warm-ups."""
    for _ in range(2):
        fn()
    sync()
    samples = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


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
    backend = cls(spec)
    rows = []
    gen = torch.Generator().manual_seed(0)
    for phase in ("decode", "prefill"):
        num_seqs, context, new = shapes[phase]
        blocks_each = -(-(context + new) // spec.block_size)
        num_blocks = num_seqs * blocks_each + 1
        order = (torch.randperm(num_blocks - 1, generator=gen) + 1).view(num_seqs, blocks_each).tolist()
        batch = build_batch(order, [context] * num_seqs, [new] * num_seqs, spec.block_size, device)
        (cache,) = backend.allocate_kv_cache(num_blocks)
        cache.normal_()
        query = torch.randn(batch.num_tokens, heads, head_dim, generator=gen).to(dtype).to(device)
        metadata = backend.build_metadata(batch)
        rows.append(
            {
                "backend": cls.name,
                "phase": phase,
                "sequences": num_seqs,
                "cached_tokens": context,
                "new_tokens": new,
                "block_size": spec.block_size,
                "metadata_ms": timed(partial(backend.build_metadata, batch), platform.synchronize, iters),
                "forward_ms": timed(partial(backend.forward, query, cache, metadata, 0), platform.synchronize, iters),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    platform = first_platform()
    shapes = SHAPES["cuda" if platform.device_type == "cuda" else "cpu"]
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
    print(f"attention kernels on {platform.name}, {shapes['dtype']}, {heads}/{kv_heads} heads of {head_dim}")
    for row in results["rows"]:
        if "skipped" in row:
            print(f"  {row['backend']:>12}  skipped: {row['skipped']}")
        else:
            shape = f"{row['sequences']} x ({row['cached_tokens']} cached + {row['new_tokens']} new)"
            print(
                f"  {row['backend']:>12}  {row['phase']:<7} {shape:<26} forward {row['forward_ms']:8.3f} ms"
                f"   build_metadata {row['metadata_ms']:7.3f} ms"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
