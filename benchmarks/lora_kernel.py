"""LoRA kernel timings on SmolLM2's shapes: one layer's add_lora_linear (shrink + expand) for a decode step (``--rows``
one-token rows, default 32) and a prefill chunk, each native path of the CPU platform against core's
PyTorch kernel.

Shapes (rank 16, bfloat16 by default): the fused qkv projection (576 in; q 576, k 192, v 192 out),
gate/up (576 in; 1536, 1536 out) and down (1536 in, 576 out). Decode rows take the adapters
round-robin (``--adapters``, default 1 4 8), so every row is its own one-token segment; the prefill
case is one ``--prefill``-token segment (default 256) per adapter. Each figure is the best of
``--repeats`` timings of ``--iterations`` calls (the machine may be shared).

    .venv/bin/python benchmarks/lora_kernel.py --dtype bfloat16
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from harness.sampling_mix import machine_isa
from kvserve.interfaces.lora_kernel import LoRAKernel
from kvserve.lora.layers import plan_lora_batch
from kvserve.lora.torch_kernel import TorchLoRAKernel
from kvserve_platform_cpu.native_lora import NativeLoRAKernel, cpu_lora_kernel

SHAPES = {"qkv": (576, [576, 192, 192]), "gate_up": (576, [1536, 1536]), "down": (1536, [576])}
"""SmolLM2-135M's projections: in_features and the output slices."""
SLOTS = 8


def time_layer(kernel: LoRAKernel, slots: np.ndarray, shape: tuple[int, list[int]], rank: int, dtype, args) -> float:
    """Microseconds per shrink + expand of one layer for the per-token ``slots``."""
    in_features, widths = shape
    gen = torch.Generator().manual_seed(0)
    batch = plan_lora_batch(slots, torch.device("cpu"))
    x = torch.randn(len(slots), in_features, generator=gen).to(dtype)
    lora_a = (torch.randn(SLOTS, in_features, len(widths) * rank, generator=gen) * 0.05).to(dtype)
    lora_b = [(torch.randn(SLOTS, rank, width, generator=gen) * 0.05).to(dtype) for width in widths]
    y = torch.zeros(len(slots), sum(widths), dtype=dtype)
    best = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        for _ in range(args.iterations):
            kernel.add_lora_linear(y, x, lora_a, lora_b, batch)
        best = min(best, (time.perf_counter() - start) / args.iterations)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--adapters", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--prefill", type=int, default=256)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)

    native = cpu_lora_kernel()  # builds the operators (or says why it cannot)
    if not isinstance(native, NativeLoRAKernel):
        raise SystemExit(f"no native LoRA kernel here: {native.name} runs instead")
    kernels: list[LoRAKernel] = [NativeLoRAKernel(path) for path in native.paths] + [TorchLoRAKernel()]
    cases = [(f"decode {args.rows} rows, {n} adapters", np.arange(args.rows) % n) for n in args.adapters]
    cases.append((f"prefill {args.prefill} tokens, 1 adapter", np.zeros(args.prefill, dtype=np.int64)))
    print(f"machine: {machine_isa()}, {torch.get_num_threads()} threads; {args.dtype}, rank {args.rank}; µs per layer")
    print(f"{'case':<34}{'shape':<9}" + "".join(f"{k.name:>24}" for k in kernels) + f"{'native/torch':>14}")
    for label, slots in cases:
        for shape_name, shape in SHAPES.items():
            times = [time_layer(kernel, slots.astype(np.int64), shape, args.rank, dtype, args) for kernel in kernels]
            print(
                f"{label:<34}{shape_name:<9}"
                + "".join(f"{t:>24.1f}" for t in times)
                + f"{times[-1] / times[0]:>13.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
