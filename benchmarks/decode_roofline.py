"""The floors under a decode step: reading every weight once, and multiplying by it.

A decode step of ``B`` sequences multiplies ``B`` rows by each weight matrix: it reads every weight
from memory once and does ``2 B`` FLOPs per weight element. This loads the model with kvserve (the
bytes its layers actually hold after packing) and measures, with the benchmark's thread count, this
machine's read bandwidth (a ``sum`` over a buffer far larger than the caches) and its multiply-add
peak (``csrc/multiply_add_peak.cpp``: independent chains of the instruction the CPU platform's GEMM
uses for the dtype, built with ``kvserve_cpu_native``). It prints both floors per step, which one
binds, and the ceiling in generated tokens/s for ``--batch`` sequences — the number no engine's
decode can beat on this machine, to read kvserve's and its peers' throughput against.

Which floor binds depends on the machine, not only the model: at 32 rows a float32 step does
16 FLOPs per byte read, so a CPU with two 512-bit FMA units a core and ~40 GB/s is bound by memory
there, and one with a single unit (or a VM granted half of it) by arithmetic.

    python benchmarks/decode_roofline.py ~/.cache/kvserve-peers/models/llama-100m --dtype bfloat16 --batch 32
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from kvserve import LLM
from kvserve.layers import VocabEmbedding
from kvserve_cpu_native import load_operators


def read_bandwidth(gib: float, repeat: int) -> float:
    """Bytes/s of a ``sum`` over a ``gib``-GiB float32 buffer (median of ``repeat`` passes)."""
    buffer = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
    buffer.sum()  # first touch
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        buffer.sum()
        seconds.append(time.perf_counter() - start)
    return buffer.numel() * 4 / statistics.median(seconds)


def multiply_add_peak(bfloat16: bool, repeat: int) -> float:
    """FLOP/s of this CPU's multiply-add units over torch's threads (median of ``repeat`` runs of
    about 0.1 s); 0 where the build has neither AVX-512 nor AVX2 with FMA."""
    load_operators("kvserve_bench", (Path(__file__).parent / "csrc" / "multiply_add_peak.cpp",))
    peak = torch.ops.kvserve_bench.multiply_add_peak
    peak(1_000_000, bfloat16)  # wakes the threads and the clocks
    return statistics.median(peak(30_000_000, bfloat16) for _ in range(repeat))


def step_tensors(model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(tensors a decode step reads whole, lookup tables it reads a row of per token), each tensor
    once: every parameter and buffer, and the LM head's packed copy (a platform kernel's, held beside
    the parameters: :meth:`VocabEmbedding.pack_head`). Lookups: rope's cos/sin and an input embedding
    that is not also the LM head (``model.lm_head``), or whose head multiplies a packed copy (a tied
    head unpacked reads the whole table)."""
    lm_head = getattr(model, "lm_head", None)
    embeddings = [m for m in model.modules() if isinstance(m, VocabEmbedding)]
    heads = [m.packed_head for m in embeddings if m.packed_head is not None]
    lookup_ids = {id(t) for m in embeddings if m is not lm_head or m.packed_head is not None for t in m.parameters()}
    lookup_ids |= {id(b) for name, b in model.named_buffers() if name.endswith((".cos", ".sin"))}
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers(), *heads]}.values()
    return [t for t in tensors if id(t) not in lookup_ids], [t for t in tensors if id(t) in lookup_ids]


def dense_elements(tensors: list[torch.Tensor]) -> int:
    """Weight elements a decode token multiplies by: those of the 2-D float tensors. Packed quantized
    weights are not counted (their elements are not multiply-adds one for one); this floor is for
    dense models."""
    return sum(t.numel() for t in tensors if t.dim() == 2 and t.dtype in (torch.float32, torch.bfloat16))


def total_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes the tensors hold."""
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="HF model directory (default: the embedded SmolLM2)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch", type=int, default=32, help="sequences decoding per step")
    parser.add_argument("--buffer-gib", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    llm = LLM(args.model, dtype=args.dtype, max_model_len=256, num_kv_blocks=64)
    whole, lookups = step_tensors(llm.engine.model)
    step_bytes, lookup_bytes = total_bytes(whole), total_bytes(lookups)
    bandwidth = read_bandwidth(args.buffer_gib, args.repeat)
    memory_floor = step_bytes / bandwidth
    flops = 2 * args.batch * dense_elements(whole)
    peak = multiply_add_peak(args.dtype == "bfloat16", args.repeat)
    arithmetic_floor = flops / peak if flops and peak else 0.0
    if not flops:
        arithmetic = "not counted (no dense float weights: the model's matmuls are quantized)"
    elif not peak:
        arithmetic = "not measured (no AVX-512 or AVX2 FMA in this build)"
    else:
        arithmetic = f"multiply-add peak {peak / 1e9:.0f} GFLOP/s -> floor {arithmetic_floor * 1e3:.2f} ms per step"
    if not arithmetic_floor:
        bound = "memory (the only floor here)"
    else:
        bound = "arithmetic" if arithmetic_floor > memory_floor else "memory"
    floor = max(memory_floor, arithmetic_floor)
    print(
        f"{args.dtype}, {torch.get_num_threads()} threads, {args.batch} sequences: a decode step reads "
        f"{step_bytes / 1e6:.1f} MB of weights (lookup tables left out: {lookup_bytes / 1e6:.1f} MB) and does "
        f"{flops / 1e9:.2f} GFLOP of dense matmuls\n"
        f"  memory: read bandwidth {bandwidth / 1e9:.1f} GB/s -> floor {memory_floor * 1e3:.2f} ms per step\n"
        f"  arithmetic: {arithmetic}\n"
        f"  bound by {bound}: ceiling "
        f"{args.batch / floor:.0f} gen tok/s"
    )


if __name__ == "__main__":
    main()
