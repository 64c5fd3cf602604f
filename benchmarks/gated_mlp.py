"""A gated MLP's gate, up and SiLU as one kernel call (``LinearKernel.apply_gated``) against the two
products and the SiLU-and-mul layer op, on this CPU's platform kernel.

``--kernel``: the ops alone over a model's MLP shapes (``--layers`` distinct weights, so they come from
DRAM as in a decode step), per dtype and row count. ``--engine``: two engines of one model in one
process, one with its MLPs' gated call turned off (``GatedMLP.gated_kernel = None``, the path before),
generating the peers' workload greedily in alternating rounds. Prints medians and each round's ratio.

    python benchmarks/gated_mlp.py --kernel
    python benchmarks/gated_mlp.py --engine ~/.cache/kvserve-peers/models/llama-100m \\
        --workload ~/.cache/kvserve-peers/workload.json --dtype bfloat16 --prompts 32 --rounds 8
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from harness.alternate import alternate
from kvserve import LLM, SamplingParams
from kvserve.layers import GatedMLP


def report(label: str, times: dict[str, list[float]], show) -> None:
    """Each variant's median (``show`` turns seconds into the printed figure) and the fused one's speed-up."""
    ratios = [unfused / fused for fused, unfused in zip(times["fused"], times["unfused"])]
    print(
        f"{label}: fused {show(statistics.median(times['fused']))}, unfused {show(statistics.median(times['unfused']))}"
        f" -> fused {statistics.median(ratios):.3f}x as fast (rounds {' '.join(f'{x:.3f}' for x in ratios)})",
        flush=True,
    )


def kernel_sweep(hidden: int, intermediate: int, layers: int, rows: list[int], rounds: int) -> None:
    from kvserve_platform_cpu.native_layer_ops import cpu_layer_ops
    from kvserve_platform_cpu.native_linear import native_linear_kernel

    kernel, ops = native_linear_kernel(None), cpu_layer_ops()
    print(f"# {layers} MLPs of {hidden} -> 2 x {intermediate}, {torch.get_num_threads()} threads, {kernel.name}")

    def fused(x: torch.Tensor, weights: list) -> None:
        for gate, up in weights:
            kernel.apply_gated(x, gate, up, "silu")

    def unfused(x: torch.Tensor, weights: list) -> None:
        for gate, up in weights:
            ops.silu_and_mul(kernel.apply(x, gate, None), kernel.apply(x, up, None))

    for dtype in (torch.float32, torch.bfloat16):
        if not kernel.fuses_gated("silu", torch.zeros(1, 2, dtype=dtype)):
            continue
        weights = [tuple(kernel.pack(torch.randn(intermediate, hidden).to(dtype)) for _ in "gu") for _ in range(layers)]
        for m in rows:
            x = torch.randn(m, hidden).to(dtype)
            variants = {"fused": lambda x=x, w=weights: fused(x, w), "unfused": lambda x=x, w=weights: unfused(x, w)}
            name = str(dtype).removeprefix("torch.")
            report(f"{name} {m} rows", alternate(variants, rounds), lambda s: f"{s * 1e3:.3f} ms")


def engine_rounds(model: str, workload: str, dtype: str, prompts: int, new_tokens: int, rounds: int) -> None:
    ids = json.load(open(workload))["prompts"][:prompts]
    engines = {}
    for name in ("fused", "unfused"):
        llm = LLM(model, dtype=dtype, max_model_len=512, max_num_seqs=max(prompts, 1))
        mlps = [m for m in llm.engine.model.modules() if isinstance(m, GatedMLP)]
        if name == "unfused":
            for mlp in mlps:
                mlp.gated_kernel = None
        elif not any(mlp.gated_kernel for mlp in mlps):
            raise SystemExit(f"no MLP of {model} runs the gated call in {dtype}: nothing to compare")
        engines[name] = llm
    params = SamplingParams(temperature=0, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True)
    for llm in engines.values():
        llm.generate(ids[:2], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)

    def run(llm: LLM) -> None:
        llm.reset_prefix_cache()
        llm.generate(ids, params, use_tqdm=False)

    times = alternate({name: (lambda llm=llm: run(llm)) for name, llm in engines.items()}, rounds)
    tokens = prompts * new_tokens
    report(f"{dtype}, {prompts} prompts x {new_tokens} tokens", times, lambda s: f"{tokens / s:.1f} tok/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", action="store_true", help="the ops alone over MLP shapes")
    parser.add_argument("--engine", metavar="MODEL", help="two engines of MODEL, the gated call off in one")
    parser.add_argument("--workload", help="JSON with 'prompts' as token-id lists (benchmarks/peers/make_workload.py)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 256])
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    if args.kernel:
        kernel_sweep(args.hidden, args.intermediate, args.layers, args.rows, args.rounds)
    if args.engine:
        if not args.workload:
            parser.error("--engine needs --workload")
        engine_rounds(args.engine, args.workload, args.dtype, args.prompts, args.new_tokens, args.rounds)


if __name__ == "__main__":
    main()
