"""AWQ on CPU: PyTorch's int4 matmul (repacked once) against dequantize-then-matmul, per call.

SmolLM2-135M's projection shapes, group 64, decode batch sizes 1, 8, 32, per activation dtype;
the minimum over repetitions (the machine is shared). kvserve-quant-awq keeps the faster per
dtype: the int4 kernel for bf16, dequantize-then-matmul for fp16 and fp32.
"""

from __future__ import annotations

import argparse
import time

import torch

from kvserve_quant_awq.contract import AwqContract
from kvserve_quant_awq.int4pack import int4_matmul, repack
from kvserve_quant_awq.packing import dequantize

SHAPES = ((576, 1536), (1536, 576), (576, 960))  # (in, out): up/gate, down, fused qkv


def best_of(fn, repetitions: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--repetitions", type=int, default=20)
    args = parser.parse_args()
    contract = AwqContract()
    contract.quant_config = {**AwqContract.quant_config, "group_size": args.group_size}
    print(f"{torch.get_num_threads()} threads, group {args.group_size}, best of {args.repetitions}")
    print(f"{'dtype':<10}{'in x out':>12}{'rows':>6}{'dequant+mm us':>16}{'int4 mm us':>12}")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for inp, out in SHAPES:
            tensors = contract.quantize(torch.randn(out, inp) * inp**-0.5)
            qweight, qzeros, scales = tensors["qweight"], tensors["qzeros"], tensors["scales"]
            packed, table = repack(qweight, qzeros, scales, dtype)
            for rows in (1, 8, 32):
                x = torch.randn(rows, inp, dtype=dtype)

                def dense(x=x, dtype=dtype, qweight=qweight, qzeros=qzeros, scales=scales):
                    return x @ dequantize(qweight, qzeros, scales.to(dtype), args.group_size)

                def int4(x=x, packed=packed, table=table):
                    return int4_matmul(x, packed, table, args.group_size)

                dense_s, int4_s = best_of(dense, args.repetitions), best_of(int4, args.repetitions)
                name = str(dtype).removeprefix("torch.")
                print(f"{name:<10}{f'{inp}x{out}':>12}{rows:>6}{dense_s * 1e6:>16.0f}{int4_s * 1e6:>12.0f}")


if __name__ == "__main__":
    main()
