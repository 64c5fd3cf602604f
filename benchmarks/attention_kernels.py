"""Attention kernel times per backend: decode and prefill at a few shapes, on a GPU.

Every installed backend that serves a shape is timed through the AttentionBackend interface
(``build_metadata`` once, then ``forward`` of one layer, the KV already written), so the first
GPU run gives Triton's numbers beside FlashAttention's and FlashInfer's. Without a GPU platform
it prints why and exits 0 (the CPU backend is timed only with ``--include-cpu``).
"""

from __future__ import annotations

import argparse
import time

import torch

from kvserve.plugins import get_plugin_manager, load_component
from kvserve.testing.attention_reference import build_batch

SHAPES = {
    # name: (num_seqs, cached tokens, new tokens)
    "decode 64x1k": (64, 1024, 1),
    "decode 8x8k": (8, 8192, 1),
    "decode 256x512": (256, 512, 1),
    "prefill 4x2k": (4, 0, 2048),
    "chunked 8x512+1k": (8, 1024, 512),
}


def gpu_platform(include_cpu: bool):
    """The first available platform that is not the CPU (or the CPU one too, if asked)."""
    reasons = []
    for name in get_plugin_manager().registry("platform").names():
        cls = load_component("platform", name)
        reason = cls.unavailable_reason()
        if reason is None and (cls.device_type != "cpu" or include_cpu):
            return cls(), reasons
        reasons.append(f"{name}: {reason or 'not a GPU'}")
    return None, reasons


def time_forward(backend, spec, platform, shape, iters: int) -> float:
    """Milliseconds per ``forward`` of one layer on a random paged batch of ``shape``."""
    num_seqs, cached, new = shape
    blocks_per_seq = -(-(cached + new) // spec.block_size)
    perm = torch.randperm(num_seqs * blocks_per_seq) + 1
    tables = perm.view(num_seqs, blocks_per_seq).tolist()
    batch = build_batch(tables, [cached] * num_seqs, [new] * num_seqs, spec.block_size, spec.device)
    (cache,) = backend.allocate_kv_cache(num_seqs * blocks_per_seq + 1)
    tokens = batch.num_tokens
    query = torch.randn(tokens, spec.num_heads, spec.head_dim, dtype=spec.dtype, device=spec.device)
    key = torch.randn(tokens, spec.num_kv_heads, spec.head_dim, dtype=spec.dtype, device=spec.device)
    metadata = backend.build_metadata(batch)
    backend.write_kv(cache, key, key, metadata)
    for _ in range(3):
        backend.forward(query, cache, metadata, 0)
    platform.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        backend.forward(query, cache, metadata, 0)
    platform.synchronize()
    return (time.perf_counter() - start) / iters * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--heads", type=int, nargs=2, default=(32, 8), metavar=("Q", "KV"))
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--include-cpu", action="store_true", help="also run on the CPU platform")
    args = parser.parse_args()

    platform, reasons = gpu_platform(args.include_cpu)
    if platform is None:
        print(f"skipped: no GPU platform available ({'; '.join(reasons) or 'none installed'})")
        return
    from kvserve.interfaces import AttentionSpec, LayerAttentionSpec

    layers = (LayerAttentionSpec(scale=args.head_dim**-0.5),)
    print(f"platform {platform.name}, {args.dtype}, heads {args.heads[0]}/{args.heads[1]}, head size {args.head_dim}")
    print(f"{'backend':<14}" + "".join(f"{name:>18}" for name in SHAPES) + "   (ms per layer forward)")
    for name in get_plugin_manager().registry("attention_backend").names():
        cls = load_component("attention_backend", name)
        row = f"{name:<14}"
        spec = AttentionSpec(
            *args.heads, args.head_dim, getattr(torch, args.dtype), cls.default_block_size, platform.device(), layers
        )
        refused = cls.unsupported_reasons(spec, platform)
        if refused:
            print(f"{row}refuses: {'; '.join(refused)}")
            continue
        backend = cls(spec)
        for shape in SHAPES.values():
            row += f"{time_forward(backend, spec, platform, shape, args.iters):>18.3f}"
        print(row)


if __name__ == "__main__":
    main()
