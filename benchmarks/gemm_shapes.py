"""The models' linear-layer GEMMs on this CPU: plain ``F.linear`` against prepacked weights.

For every projection of a model (fused qkv and gate-up, and their separate shards), at decode
batch sizes and one prefill size, in float32 and bfloat16, times:

- ``linear``: ``F.linear(x, W)`` (what the layers run without a platform kernel);
- ``onednn``: ``torch.ops.mkldnn._reorder_linear_weight`` once, then
  ``torch.ops.mkldnn._linear_pointwise`` (inductor's freezing path for bfloat16);
- ``native``: the CPU platform's own kernel (AVX-512 or AVX2) (``kvserve_platform_cpu.native_linear``), packed once
  and applied as the engine does, where it runs the dtype;
- ``mkl`` (float32 only): ``torch.ops.mkl._mkl_reorder_linear_weight`` packed for that exact M,
  then ``torch.ops.mkl._mkl_linear`` (inductor's float32 path; it falls back to the plain weight
  for any other M, so a real engine would need one packed copy per batch size);
- ``split``: for a fused projection, its shards as separate ``F.linear`` calls.

Methods alternate within each round; each method's fastest round is printed (on a shared
machine a slow round is another process's time slice, not the kernel's; read the ratios). Each row also says whether the
method's output is bitwise equal to ``F.linear``'s (float32 greedy parity depends on it). One shape
repeated runs from a hot cache where its weight fits in L2/L3.

``--sweep`` times what a decode step does instead: every projection of the model in model order
(layers x [qkv, o, gate, up, down], then the LM head; gate and up separate, as the models run
them), each with its own weight, so every weight comes from DRAM as in a decode step. A round runs
one whole pass per method (``linear``, and the engine's kernels as it packs them: ``onednn`` for a
32-row batch, ``native``), the order rotating per round; printed are each method's median ms per
pass, the weight bytes it streamed per second, and its speed relative to ``onednn``.

    OMP_NUM_THREADS=2 python benchmarks/gemm_shapes.py --model llama-100m --dtype float32
    OMP_NUM_THREADS=2 python benchmarks/gemm_shapes.py --sweep --model llama-100m --dtype bfloat16 --m 1 8 32
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvserve.interfaces import LinearKernel
from kvserve_platform_cpu.native_linear import NativeLinearKernel
from kvserve_platform_cpu.onednn_linear import onednn_linear_kernel
from kvserve_platform_cpu.platform import CpuPlatform

# name -> (hidden, intermediate, heads, kv heads, head dim, vocab, layers)
MODELS = {
    "llama-100m": (768, 2048, 12, 4, 64, 32000, 12),
    "smollm2-135m": (576, 1536, 9, 3, 64, 49152, 30),
}


def projections(model: str) -> dict[str, tuple[int, list[int]]]:
    """Projection name -> (input features, output features of each fused shard)."""
    hidden, inter, heads, kv_heads, head_dim, vocab, _ = MODELS[model]
    return {
        "qkv": (hidden, [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]),
        "o": (hidden, [hidden]),
        "gate_up": (hidden, [inter, inter]),
        "down": (inter, [hidden]),
        "lm_head": (hidden, [vocab]),
    }


def time_us(fn: Callable[[], object], iters: int) -> float:
    """Microseconds per call over ``iters`` back-to-back calls."""
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters * 1e6


def sweep_projections(model: str) -> list[tuple[str, int, int]]:
    """(name, input features, output features) of every projection a decode step runs, in order."""
    hidden, inter, heads, kv_heads, head_dim, vocab, layers = MODELS[model]
    layer = [
        ("qkv", hidden, (heads + 2 * kv_heads) * head_dim),
        ("o", heads * head_dim, hidden),
        ("gate", hidden, inter),
        ("up", hidden, inter),
        ("down", inter, hidden),
    ]
    return layer * layers + [("lm_head", hidden, vocab)]


def native_kernel(dtype: torch.dtype) -> NativeLinearKernel | None:
    """The CPU platform's own kernel where it is built and runs ``dtype`` here."""
    kernel = CpuPlatform().linear_kernel()
    return kernel if isinstance(kernel, NativeLinearKernel) and dtype in kernel.dtypes else None


def methods(
    x: torch.Tensor, sizes: list[int], weight: torch.Tensor, pack_m: int | None
) -> dict[str, Callable[[], torch.Tensor]]:
    """The ways to compute ``x @ weight.T`` for one projection (oneDNN packed for ``pack_m`` rows,
    ``None``: for ``x``'s own row count; ``onednn_plain``: oneDNN on the unpacked weight)."""
    m = x.shape[0]
    out: dict[str, Callable[[], torch.Tensor]] = {"linear": lambda: F.linear(x, weight)}
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, pack_m or m)
    out["onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    out["onednn_plain"] = lambda: torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
    native = native_kernel(weight.dtype)
    native_packed = native.pack(weight) if native is not None else None
    if native_packed is not None:
        out["native"] = lambda: native.apply(x, native_packed, None)
    if weight.dtype == torch.float32 and torch._C.has_mkl:
        mkl_packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, m)
        out["mkl"] = lambda: torch.ops.mkl._mkl_linear(x, mkl_packed, weight, None, m)
    if len(sizes) > 1:
        shards = [w.contiguous() for w in weight.split(sizes)]
        out["split"] = lambda: [F.linear(x, w) for w in shards]
        packed_shards = [torch.ops.mkldnn._reorder_linear_weight(w, pack_m or m) for w in shards]
        out["split_onednn"] = lambda: [
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "") for w in packed_shards
        ]
    return out


def bitwise_equal(result: torch.Tensor | list[torch.Tensor], reference: torch.Tensor) -> bool:
    got = torch.cat(result, dim=-1) if isinstance(result, list) else result
    return torch.equal(got, reference)


def run_pass(inputs: list[torch.Tensor], kernel: LinearKernel | None, weights: list[torch.Tensor]) -> None:
    """One projection after the other, as a decode step runs them (``kernel`` None: ``F.linear``)."""
    for x, w in zip(inputs, weights, strict=True):
        if kernel is None:
            F.linear(x, w)
        else:
            kernel.apply(x, w, None)


def sweep(model: str, dtype: torch.dtype, ms: list[int], rounds: int) -> None:
    """Whole decode-step passes over every projection (distinct weights) per method; medians."""
    projs = sweep_projections(model)
    gen = torch.Generator().manual_seed(0)
    dense = [(torch.randn(n, k, generator=gen) * 0.02).to(dtype) for _, k, n in projs]
    kernels: dict[str, LinearKernel | None] = {"onednn": onednn_linear_kernel(), "native": native_kernel(dtype)}
    passes: dict[str, tuple[LinearKernel | None, list[torch.Tensor]]] = {"linear": (None, dense)}
    for name, kernel in kernels.items():
        packed = [kernel.pack(w) for w in dense] if kernel is not None else []
        if packed and all(p is not None for p in packed):
            passes[name] = (kernel, packed)
        else:
            print(f"# {name}: not run ({'no kernel here' if kernel is None else f'it does not pack {dtype}'})")
    names = list(passes)
    weight_bytes = sum(w.numel() * w.element_size() for w in dense)
    layers = MODELS[model][-1]
    print(
        f"# sweep {model} {str(dtype).removeprefix('torch.')} threads={torch.get_num_threads()} "
        f"torch {torch.__version__}: {len(projs)} "
        f"projections per pass ({layers} layers x qkv, o, gate, up, down + lm_head), "
        f"{weight_bytes / 2**20:.0f} MiB of weights per method, {rounds} rounds, medians"
    )
    print(f"{'M':>4} {'method':8} {'ms/pass':>9} {'GB/s':>6} {'vs onednn':>9}")
    for m in ms:
        xs = {k: torch.randn(m, k, generator=gen).to(dtype) for k in {k for _, k, _ in projs}}
        inputs = [xs[k] for _, k, _ in projs]
        for name in names:  # warm-up: oneDNN's primitives for these shapes, first touches
            run_pass(inputs, *passes[name])
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                run_pass(inputs, *passes[name])
                times[name].append((time.perf_counter() - start) * 1e3)
        medians = {name: statistics.median(t) for name, t in times.items()}
        for name in names:
            ratio = f"{medians['onednn'] / medians[name]:8.2f}x" if "onednn" in medians else "      n/a"
            gbps = weight_bytes / medians[name] / 1e6
            print(f"{m:4d} {name:8} {medians[name]:9.2f} {gbps:6.1f} {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="llama-100m")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--m", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 512])
    parser.add_argument("--only", nargs="*", help="projection names to run (default: all)")
    parser.add_argument("--pack-m", type=int, help="oneDNN packing hint (default: each M its own)")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--target-ms", type=float, default=3.0, help="time per method per round")
    parser.add_argument(
        "--sweep", action="store_true", help="whole passes over every projection in model order (weights from DRAM)"
    )
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.sweep:
        sweep(args.model, dtype, args.m, args.rounds)
        return
    gen = torch.Generator().manual_seed(0)
    print(
        f"# {args.model} {args.dtype} threads={torch.get_num_threads()} pack_m={args.pack_m} torch {torch.__version__}"
    )
    print(f"{'proj':8} {'M':>5} {'method':13} {'us':>9} {'GFLOP/s':>8} {'vs linear':>9} bitwise")
    for name, (k, sizes) in projections(args.model).items():
        if args.only and name not in args.only:
            continue
        n = sum(sizes)
        weight = (torch.randn(n, k, generator=gen) * 0.02).to(dtype)
        for m in args.m:
            x = torch.randn(m, k, generator=gen).to(dtype)
            fns = methods(x, sizes, weight, args.pack_m)
            reference = fns["linear"]()
            equal = {key: bitwise_equal(fn(), reference) for key, fn in fns.items()}
            single = time_us(fns["linear"], 3)
            iters = max(1, int(args.target_ms * 1e3 / max(single, 1.0)))
            times: dict[str, list[float]] = {key: [] for key in fns}
            for _ in range(args.rounds):
                for key, fn in fns.items():
                    times[key].append(time_us(fn, iters))
            base = min(times["linear"])
            for key in fns:
                us = min(times[key])
                gflops = 2 * m * n * k / us / 1e3
                print(f"{name:8} {m:5d} {key:13} {us:9.1f} {gflops:8.1f} {base / us:9.2f}x {equal[key]}")


if __name__ == "__main__":
    main()
