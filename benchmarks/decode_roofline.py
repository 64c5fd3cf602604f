"""The memory-bandwidth floor of a decode step: every step reads every weight once.

A decode step of ``B`` sequences multiplies ``B`` rows by each weight matrix, so below a few
hundred rows the step is bound by reading the weights from memory, not by arithmetic. This
loads the model with kvserve (the bytes its layers actually hold after packing), measures this
machine's read bandwidth with the benchmark's thread count (a ``sum`` over a buffer far larger
than the caches), and prints the implied floor per step and the ceiling in generated tokens/s
for ``--batch`` sequences — the number no engine's decode can beat on this machine, to read
kvserve's and its peers' throughput against.

    python benchmarks/decode_roofline.py ~/.cache/kvserve-peers/models/llama-100m --dtype bfloat16 --batch 32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvserve import LLM
from kvserve.layers import VocabEmbedding


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


def weight_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes a decode step reads, bytes left out): every parameter and buffer once, except lookup
    tables read a row per token — rope's cos/sin and an input embedding that is not also the LM
    head (``model.lm_head``; a tied head reads the whole table every step)."""
    lm_head = getattr(model, "lm_head", None)
    lookups = [m for m in model.modules() if isinstance(m, VocabEmbedding) and m is not lm_head]
    skipped = {id(t) for m in lookups for t in m.parameters()}
    skipped |= {id(b) for name, b in model.named_buffers() if name.endswith((".cos", ".sin"))}
    read, left_out, seen = 0, 0, set()
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        size = tensor.numel() * tensor.element_size()
        if id(tensor) in skipped:
            left_out += size
        else:
            read += size
    return read, left_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="HF model directory (default: the embedded SmolLM2)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch", type=int, default=32, help="sequences decoding per step")
    parser.add_argument("--buffer-gib", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    llm = LLM(args.model, dtype=args.dtype, max_model_len=256, num_kv_blocks=64)
    step_bytes, lookup_bytes = weight_bytes(llm.engine.model)
    bandwidth = read_bandwidth(args.buffer_gib, args.repeat)
    floor = step_bytes / bandwidth
    print(
        f"{args.dtype}, {torch.get_num_threads()} threads: a decode step reads {step_bytes / 1e6:.1f} MB of weights "
        f"(lookup tables left out: {lookup_bytes / 1e6:.1f} MB); read bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s -> floor {floor * 1e3:.2f} ms per step, ceiling "
        f"{args.batch / floor:.0f} gen tok/s at {args.batch} sequences"
    )


if __name__ == "__main__":
    main()
