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
import itertools
import statistics

import torch

from harness.alternate import alternate
from harness.sampling_mix import machine_isa
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
        f"{torch.get_num_threads()} threads, {args.copies} weights in turn, {args.rounds} rounds, medians; "
        f"{machine_isa()}"
    )
    print(f"{'vocab':>7} {'rows':>4} {'apply+float us':>15} {'apply_logits us':>16} {'ratio':>6}")
    gen = torch.Generator().manual_seed(0)
    for vocab in args.vocab:
        heads = [
            kernel.pack(torch.randn(vocab, args.hidden, generator=gen).to(dtype) * 0.05) for _ in range(args.copies)
        ]
        for rows in args.rows:
            x = torch.randn(rows, args.hidden, generator=gen).to(dtype)
            assert torch.equal(kernel.apply(x, heads[0], None).float(), kernel.apply_logits(x, heads[0]))
            # Each method takes the heads in turn (a cycle of its own), so both read each head from DRAM alike.
            times = alternate(
                {
                    "apply+float": lambda x=x, turn=itertools.cycle(heads): kernel.apply(x, next(turn), None).float(),
                    "apply_logits": lambda x=x, turn=itertools.cycle(heads): kernel.apply_logits(x, next(turn)),
                },
                args.rounds,
            )
            before, after = (statistics.median(seconds) * 1e6 for seconds in times.values())
            print(f"{vocab:>7} {rows:>4} {before:>15.1f} {after:>16.1f} {after / before:>5.3f}x")


if __name__ == "__main__":
    main()
