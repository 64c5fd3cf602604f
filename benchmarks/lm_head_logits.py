"""The LM head's float32 logits on this CPU's platform kernel: ``apply_logits`` (the kernel writes the
rounded products as float32) against ``apply(...).float()`` (the product in the model dtype, then a
second pass widening it), which give the same values.

Each case holds ``--copies`` distinct head weights, used in turn, so that each call reads its weight
from DRAM as a decode step does; the two methods alternate, the order flipping every round. Prints
each method's median microseconds per call and their ratio.

    python benchmarks/lm_head_logits.py [--dtype bfloat16] [--rows 1 8 32] [--vocab 32000 128256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvserve_platform_cpu.platform import CpuPlatform


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    kernel = CpuPlatform().linear_kernel()
    print(
        f"# LM head logits, {args.dtype}, hidden {args.hidden}, linear_kernel={kernel.name}, "
        f"{torch.get_num_threads()} threads, {args.copies} weights in turn, {args.rounds} rounds, medians"
    )
    print(f"{'vocab':>7} {'rows':>4} {'apply+float us':>15} {'apply_logits us':>16} {'ratio':>6}")
    gen = torch.Generator().manual_seed(0)
    for vocab in args.vocab:
        heads = [
            kernel.pack(torch.randn(vocab, args.hidden, generator=gen).to(dtype) * 0.05) for _ in range(args.copies)
        ]
        for rows in args.rows:
            x = torch.randn(rows, args.hidden, generator=gen).to(dtype)
            methods = {
                "apply+float": lambda head, x=x: kernel.apply(x, head, None).float(),
                "apply_logits": lambda head, x=x: kernel.apply_logits(x, head),
            }
            assert torch.equal(methods["apply+float"](heads[0]), methods["apply_logits"](heads[0]))
            times: dict[str, list[float]] = {name: [] for name in methods}
            for r in range(args.rounds):
                for name in methods if r % 2 else reversed(methods):
                    head = heads[r % len(heads)]
                    start = time.perf_counter()
                    methods[name](head)
                    times[name].append(time.perf_counter() - start)
            before, after = (statistics.median(times[name]) * 1e6 for name in methods)
            print(f"{vocab:>7} {rows:>4} {before:>15.1f} {after:>16.1f} {after / before:>5.3f}x")


if __name__ == "__main__":
    main()
