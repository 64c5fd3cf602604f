"""Attention kernel timings per backend on fixed decode and prefill batches.

On a CUDA machine it times every installed backend that serves the shape (triton, flash_attn,
flashinfer, ...) and names the ones that refuse, with their reasons; elsewhere it times the
platform's first-choice backend (on a CPU: ``cpu``, with its C++ kernel and, A/B, with its PyTorch
fallback). ``build_metadata`` (host planning, once per step) and ``forward`` (one layer) are timed
separately; ``forward`` as wall-clock and as this process's CPU time (steadier on a shared machine).

    python benchmarks/attention_kernels.py [--json out.json] [--dtype float32] [--heads 32,8,64]
        [--lookahead 1,3,7] [--contexts 500,2000] [--decodes-only] [--layers 12]

``--lookahead K,...`` follows each decode case with the same sequences and contexts queried with
1 + K tokens (speculative decoding's verification step; phase "lookahead"), each row also giving
its time over the decode's (``vs_decode``): K/V are read once for all rows, so a kernel whose fast
path serves such steps stays near 1. ``--contexts`` gives the decode cases these fixed cached
lengths instead; ``--decodes-only`` drops the prefill cases. ``--layers N`` gives each case N caches
of its own, attended in turn as a step walks the layers, and reports the time per layer: once the N
caches outgrow the last-level cache, every layer's K/V come from memory, as in an engine's step
(with one cache, the default, they stay cached from one call to the next).
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


def timed(fns, sync, iters: int) -> list[tuple[float, float]]:
    """Median wall-clock and process-CPU milliseconds of each of ``fns`` over ``iters`` rounds after
    two warm-ups; each round runs every function once, in turn, so that a busy spell on a shared
    machine lands on all of them rather than on whichever ran then."""
    for _ in range(2):
        for fn in fns:
            fn()
    sync()
    wall, cpu = [[] for _ in fns], [[] for _ in fns]
    for _ in range(iters):
        for i, fn in enumerate(fns):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            sync()
            wall[i].append((time.perf_counter() - start) * 1e3)
            cpu[i].append((time.process_time() - start_cpu) * 1e3)
    return [(statistics.median(w), statistics.median(c)) for w, c in zip(wall, cpu)]


def variants(cls) -> list[tuple[str, type]]:
    """``(kernel label, class)`` to time: the backend, plus its PyTorch fallback where it has a C++
    kernel that can be turned off (the ``cpu`` backend's ``native`` switch)."""
    if not getattr(cls, "native", False):
        return [("", cls)]
    return [("native", cls), ("pytorch", type(f"{cls.__name__}PyTorch", (cls,), {"native": False}))]


def lookahead_cases(cases: list[tuple], lookahead: list[int], contexts: list[int] | None, decodes_only: bool):
    """The cases to time: each decode case (once per context of ``contexts`` where given) followed by
    its lookahead cases (the same sequences and contexts, 1 + k new tokens for k in ``lookahead``)."""
    out = []
    for phase, num_seqs, context, new in cases:
        if phase != "decode":
            if not decodes_only:
                out.append((phase, num_seqs, context, new))
            continue
        for cached in contexts or [context]:
            out.append((phase, num_seqs, cached, new))
            out += [("lookahead", num_seqs, cached, 1 + k) for k in lookahead]
    return out


def bench_backend(cls, platform, shapes, iters: int, layers: int = 1) -> list[dict]:
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
    groups: list[list[tuple]] = []  # a decode and its lookahead cases are timed together
    for case in shapes["cases"]:
        if case[0] == "lookahead" and groups:
            groups[-1].append(case)
        else:
            groups.append([case])
    for group in groups:
        runs = []  # (row, forward, build_metadata) per case and kernel
        for phase, num_seqs, context, new in group:
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
            caches = None  # the case's caches, one a layer: the variants share their layout
            for kernel, variant in variants(cls):
                backend = variant(spec)
                if getattr(backend, "fallback_reason", None) is not None:  # no C++ kernel here: say so
                    kernel = "pytorch"
                if caches is None:
                    caches = [backend.allocate_kv_cache(num_blocks)[0].normal_() for _ in range(layers)]
                metadata = backend.build_metadata(batch)
                row = {
                    "backend": cls.name,
                    "kernel": kernel,
                    "phase": phase,
                    "sequences": num_seqs,
                    "cached_tokens": context,
                    "new_tokens": new,
                    "block_size": spec.block_size,
                    "layers": layers,
                }
                runs.append(
                    (
                        row,
                        partial(attend_layers, backend, query, caches, metadata),
                        partial(backend.build_metadata, batch),
                    )
                )
        forwards = timed([forward for _, forward, _ in runs], platform.synchronize, iters)
        metadata_ms = timed([build for _, _, build in runs], platform.synchronize, iters)
        decode_ms = {}  # kernel -> the group's decode's forward_ms
        for (row, _, _), (forward_ms, forward_cpu_ms), (build_ms, _) in zip(runs, forwards, metadata_ms):
            forward_ms, forward_cpu_ms = forward_ms / layers, forward_cpu_ms / layers
            row.update(metadata_ms=build_ms, forward_ms=forward_ms, forward_cpu_ms=forward_cpu_ms)
            if row["phase"] == "decode":
                decode_ms[row["kernel"]] = forward_ms
            elif row["phase"] == "lookahead" and row["kernel"] in decode_ms:
                row["vs_decode"] = forward_ms / decode_ms[row["kernel"]]
            rows.append(row)
    return rows


def attend_layers(backend, query: torch.Tensor, caches: list, metadata) -> None:
    """One forward per cache, in turn (every cache a layer of the spec's one layer's shape)."""
    for cache in caches:
        backend.forward(query, cache, metadata, 0)


def int_list(text: str) -> list[int]:
    """``"1,3,7"`` -> ``[1, 3, 7]`` (argparse's type for the comma-separated options)."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--dtype", help="instead of the platform's default (cuda: float16, cpu: bfloat16)")
    parser.add_argument("--heads", type=int_list, help="query heads, KV heads, head size (e.g. 32,8,64)")
    parser.add_argument("--lookahead", type=int_list, default=[], help="k,...: decodes also with 1 + k query tokens")
    parser.add_argument("--contexts", type=int_list, help="cached tokens of the decode cases, one case each")
    parser.add_argument("--decodes-only", action="store_true", help="leave out the prefill cases")
    parser.add_argument("--layers", type=int, default=1, help="caches per case, attended in turn (time per layer)")
    args = parser.parse_args()
    if args.heads is not None and len(args.heads) != 3:
        parser.error("--heads: three numbers (query heads, KV heads, head size)")
    if args.layers < 1:
        parser.error("--layers: at least 1")
    if any(k < 1 for k in args.lookahead):
        parser.error("--lookahead: each k is at least 1 (the 1 + k query tokens of a verification step)")
    platform = first_platform()
    shapes = dict(SHAPES["cuda" if platform.device_type == "cuda" else "cpu"])
    if args.dtype:
        shapes["dtype"] = args.dtype
    if args.heads:
        shapes["heads"] = tuple(args.heads)
    shapes["cases"] = lookahead_cases(shapes["cases"], args.lookahead, args.contexts, args.decodes_only)
    results = {"platform": platform.name, "dtype": shapes["dtype"], "heads": shapes["heads"], "rows": []}
    if platform.device_type == "cuda":
        names = get_plugin_manager().registry("attention_backend").names()
    else:  # interpreters (Triton's on a CPU) would time nothing useful: the platform's first choice only
        names = list(platform.preferred_attention_backends[:1])
    for name in names:
        cls = load_component("attention_backend", name)
        if platform.device_type in cls.device_types:
            results["rows"] += bench_backend(cls, platform, shapes, args.iters, args.layers)
    heads, kv_heads, head_dim = shapes["heads"]
    print(
        f"attention kernels on {platform.name}, {shapes['dtype']}, {heads}/{kv_heads} heads of {head_dim}, "
        f"{torch.get_num_threads()} threads"
        + (f"; {args.layers} caches a case in turn, per layer" if args.layers > 1 else "")
    )
    for row in results["rows"]:
        if "skipped" in row:
            print(f"  {row['backend']:>12}  skipped: {row['skipped']}")
        else:
            cached = row["cached_tokens"]
            cached = f"{cached[0]}-{cached[1]}" if isinstance(cached, (list, tuple)) else cached
            shape = f"{row['sequences']} x ({cached} cached + {row['new_tokens']} new)"
            ratio = f"  {row['vs_decode']:5.2f}x decode" if "vs_decode" in row else ""
            print(
                f"  {row['backend']:>12} {row['kernel']:<8} {row['phase']:<9} {shape:<28} forward "
                f"{row['forward_ms']:8.3f} ms ({row['forward_cpu_ms']:8.3f} ms CPU)"
                f"   build_metadata {row['metadata_ms']:7.3f} ms{ratio}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
