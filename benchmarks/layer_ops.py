"""Per-op microbenchmark: core's PyTorch layer ops vs the CPU platform's fused C++ ones.

SmolLM2-135M's shapes (hidden 576, intermediate 1536, 9/3 heads of 64) at a decode batch and
a prefill chunk. Each sample times ``--calls`` calls; the two implementations alternate sample by
sample (pairing keeps the ratio honest on a shared machine) and the medians are printed, with
the median per-call CPU time of this process (what the op cost us, whatever else ran).

    OMP_NUM_THREADS=2 python benchmarks/layer_ops.py --dtype bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from kvserve.layers import TorchLayerOps
from kvserve_platform_cpu.native_layer_ops import NativeLayerOps, cpu_layer_ops


def cases(tokens: int, dtype: torch.dtype) -> dict[str, Callable[[object], object]]:
    """Op name -> a call of that op on ``tokens`` rows of SmolLM2's shapes."""
    hidden, intermediate, heads, kv_heads, head_dim = 576, 1536, 9, 3, 64
    x, residual = torch.randn(tokens, hidden, dtype=dtype), torch.randn(tokens, hidden, dtype=dtype)
    weight = torch.randn(hidden, dtype=dtype)
    gate, up = torch.randn(tokens, intermediate, dtype=dtype), torch.randn(tokens, intermediate, dtype=dtype)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)
    cos, sin = torch.randn(2048, head_dim // 2), torch.randn(2048, head_dim // 2)
    positions = torch.randint(0, 2048, (tokens,))
    return {
        "rms_norm": lambda ops: ops.rms_norm(x, weight, 1e-5, 0.0),
        "fused_add_rms_norm": lambda ops: ops.fused_add_rms_norm(x, residual, weight, 1e-5, 0.0),
        "gemma fused_add_rms_norm": lambda ops: ops.fused_add_rms_norm(x, residual, weight, 1e-6, 1.0),
        "silu_and_mul": lambda ops: ops.silu_and_mul(gate, up),
        "rotary_embedding": lambda ops: ops.rotary_embedding(positions, q, k, cos, sin),
    }


def sample(fn: Callable[[object], object], ops: object, calls: int) -> tuple[float, float]:
    """(wall, own CPU) microseconds per call over ``calls`` calls."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn(ops)
    return (time.perf_counter() - wall) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 512])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--samples", type=int, default=7)
    args = parser.parse_args()
    native = cpu_layer_ops()
    if not isinstance(native, NativeLayerOps):
        raise SystemExit(f"no native ops to compare: {native.describe()}")
    implementations = {"torch": TorchLayerOps(), "native": native}
    dtype = getattr(torch, args.dtype)
    print(f"{args.dtype}, {torch.get_num_threads()} threads, {args.samples} samples x {args.calls} calls, medians")
    print(f"{'op':<26}{'tokens':>7}{'torch us':>10}{'native us':>11}{'speedup':>9}{'torch cpu':>11}{'native cpu':>12}")
    for tokens in args.tokens:
        for name, fn in cases(tokens, dtype).items():
            for ops in implementations.values():  # warm-up
                sample(fn, ops, 20)
            runs: dict[str, list[tuple[float, float]]] = {key: [] for key in implementations}
            for _ in range(args.samples):
                for key, ops in implementations.items():
                    runs[key].append(sample(fn, ops, args.calls))
            wall = {key: statistics.median(r[0] for r in runs[key]) for key in runs}
            cpu = {key: statistics.median(r[1] for r in runs[key]) for key in runs}
            print(
                f"{name:<26}{tokens:>7}{wall['torch']:>10.1f}{wall['native']:>11.1f}"
                f"{wall['torch'] / wall['native']:>8.1f}x{cpu['torch']:>11.1f}{cpu['native']:>12.1f}"
            )


if __name__ == "__main__":
    main()
