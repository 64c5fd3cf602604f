"""Multi-LoRA decoding on the embedded SmolLM2 (bfloat16): tokens/s with 0, 1, 4 and 8 distinct adapters.

``--prompts`` chat prompts (default 32) each generate exactly ``--max-tokens`` greedy tokens (default
128), all submitted at once; with ``n`` adapters, prompt ``i`` runs adapter ``i mod n`` (round-robin,
so a decode step mixes them all), with 0 the base model on the same LoRA-enabled engine. The
adapters are rank-16 PEFT adapters of q, k, v, o, gate, up and down made with the real ``peft``
library (random non-zero A and B), saved to a temporary folder. ``--kernels`` runs each case on each
LoRA kernel: ``native`` (the CPU platform's C++ kernel on the best path the CPU runs), a native path by
name (``avx512-bf16``, ``avx512``, ``portable``) or ``torch`` (core's PyTorch kernel), one engine
each (``KVSERVE_LORA_KERNEL``), prefix caching off so that every case prefills its prompts.
Prints the machine's ISA, the time to read an adapter, and per case tokens/s (the best of
``--repeats`` rounds) and the ratio to the same kernel's 0-adapter run.

    .venv/bin/python benchmarks/lora.py --kernels native torch --adapters 0 1 4 8
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from harness.sampling_mix import machine_isa
from kvserve import LLM
from kvserve.benchmarking.offline import fixed_length_params
from kvserve.benchmarking.workload import chat_prompt_ids
from kvserve.lora import LoRARequest
from kvserve.testing.hf_models import build_lora_adapter, embedded_hf_directory

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK = 16


def make_adapters(base: Path, folder: Path, count: int) -> list[Path]:
    """``count`` rank-16 adapters of every projection, each with its own random A and B. Small
    weights (std 0.02): non-zero, yet the outputs stay finite in bfloat16."""
    return [
        build_lora_adapter(
            base, folder / f"adapter{i}", seed=i, scale=0.02, r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS
        )
        for i in range(count)
    ]


def run_kernel(kernel: str, model: Path, adapters: list[Path], args: argparse.Namespace) -> dict[int, float]:
    """One engine on ``kernel``: the adapters read once (timed), a warm-up, then ``args.repeats``
    rounds of every adapter count in turn; the best tokens/s of each count. Prefix caching is off:
    every case prefills its prompts."""
    if kernel == "native":
        os.environ.pop("KVSERVE_LORA_KERNEL", None)
    else:
        os.environ["KVSERVE_LORA_KERNEL"] = kernel
    max_loras = max(max(args.adapters), 1)
    llm = LLM(
        str(model),
        dtype="bfloat16",
        max_model_len=2048,
        enable_lora=True,
        max_lora_rank=RANK,
        max_loras=max_loras,
        max_cpu_loras=max_loras,
        enable_prefix_caching=False,
    )
    try:
        requests = [LoRARequest(f"adapter{i}", i + 1, str(path)) for i, path in enumerate(adapters)]
        start = time.perf_counter()
        for request in requests:
            llm.engine.load_lora(request)
        load_ms = (time.perf_counter() - start) * 1000 / max(len(requests), 1)
        print(f"[{kernel}] lora_kernel={llm.engine.executor.info.lora_kernel}; reading an adapter: {load_ms:.0f} ms")
        prompt_ids = chat_prompt_ids(llm.get_tokenizer(), args.prompts)
        # Warm-up: every adapter's slot filled, prefill and decode through the kernel once.
        llm.generate(
            prompt_ids[: len(requests) or 1], fixed_length_params(4), use_tqdm=False, lora_request=requests or None
        )
        best = dict.fromkeys(args.adapters, 0.0)
        for _ in range(args.repeats):
            for count in args.adapters:
                loras = [requests[i % count] if count else None for i in range(args.prompts)]
                params = fixed_length_params(args.max_tokens)
                start = time.perf_counter()
                outputs = llm.generate(prompt_ids, params, use_tqdm=False, lora_request=loras)
                rate = sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start)
                best[count] = max(best[count], rate)
                print(f"[{kernel}] {count} adapters: {rate:.1f} tok/s", flush=True)
        return best
    finally:
        llm.engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model directory; default the embedded SmolLM2")
    parser.add_argument("--kernels", nargs="+", default=["native", "torch"])
    parser.add_argument("--adapters", nargs="+", type=int, default=[0, 1, 4, 8])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the cases; each case's best is reported")
    args = parser.parse_args()

    print(f"machine: {machine_isa()}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as folder:
        base = Path(args.model) if args.model else embedded_hf_directory()
        start = time.perf_counter()
        adapters = make_adapters(base, Path(folder), max(args.adapters))
        made = time.perf_counter() - start
        print(f"made {len(adapters)} rank-{RANK} adapters of {', '.join(TARGETS)} with peft in {made:.1f} s")
        table = {kernel: run_kernel(kernel, base, adapters, args) for kernel in args.kernels}

    print(f"\n{args.prompts} prompts x {args.max_tokens} tokens, bfloat16, adapters round-robin over the prompts")
    print(f"{'kernel':<14}{'adapters':>9}{'tok/s':>10}{'vs 0 adapters':>15}")
    for kernel, results in table.items():
        base_rate = results.get(0)
        for count, rate in results.items():
            ratio = f"{rate / base_rate:.2f}x" if base_rate else "-"
            print(f"{kernel:<14}{count:>9}{rate:>10.1f}{ratio:>15}")


if __name__ == "__main__":
    main()
