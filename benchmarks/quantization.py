"""Weight memory, decode and prefill tokens/s of bf16, FP8 and AWQ side by side on this CPU.

The model is a random-weight Llama of about 100M linear parameters (16 layers, hidden 768,
intermediate 2048, GQA 12/4 heads), built locally; FP8 is online dynamic FP8
(``quantization="fp8"`` on the bf16 checkpoint: the same FP8 layers a checkpoint loads into),
AWQ a 4-bit group-128 GEMM checkpoint packed with the AWQ contract's reference packer.
Everything runs in bf16 activations. Prefill: a few long prompts, one output token each.
Decode: a batch of short prompts generating a fixed number of tokens (decode-dominated);
``--decode-rounds N`` measures it N times, alternating between the variants with every engine
loaded, and reports medians (fairer on a busy machine than one engine after the other).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from kvserve import LLM
from kvserve.benchmarking.offline import fixed_length_params
from kvserve.benchmarking.workload import random_prompt_ids
from kvserve.testing.hf_models import build_tiny_model
from kvserve_quant_awq.contract import AwqContract

MODEL = dict(
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=16,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=1024,
    torch_dtype="bfloat16",
)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def awq_checkpoint(base: Path, out: Path, group_size: int = 128) -> Path:
    """``base`` with every projection as AWQ GEMM tensors (quantization_config included)."""
    out.mkdir()
    for file in base.iterdir():
        if file.suffix != ".safetensors":
            (out / file.name).write_bytes(file.read_bytes())
    contract = AwqContract()
    contract.quant_config = {**AwqContract.quant_config, "group_size": group_size}
    weights = load_file(base / "model.safetensors")
    for name in [n for n in weights if n.rpartition(".")[0].endswith(PROJECTIONS)]:
        prefix = name.removesuffix(".weight")
        for key, tensor in contract.quantize(weights.pop(name).float()).items():
            weights[f"{prefix}.{key}"] = tensor
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4, "version": "gemm",
    }  # fmt: skip
    (out / "config.json").write_text(json.dumps(config))
    return out


def measure(llm: LLM, prompts: list[list[int]], output_len: int) -> tuple[float, int]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, fixed_length_params(output_len), use_tqdm=False)
    return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefill-prompts", type=int, default=4)
    parser.add_argument("--prefill-len", type=int, default=256)
    parser.add_argument("--decode-prompts", type=int, default=8)
    parser.add_argument("--decode-len", type=int, default=32)
    parser.add_argument("--decode-rounds", type=int, default=1, help="decode rounds, alternating variants (medians)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = build_tiny_model("llama", Path(tmp) / "bf16", **MODEL)
        awq = awq_checkpoint(base, Path(tmp) / "awq")
        variants = {"bf16": (base, {}), "fp8 (online)": (base, {"quantization": "fp8"}), "awq g128": (awq, {})}
        llms, weight_bytes, prefill, decode = {}, {}, {}, {label: [] for label in variants}
        for label, (path, fields) in variants.items():
            llm = llms[label] = LLM(str(path), dtype="bfloat16", max_model_len=1024, num_kv_blocks=160, **fields)
            vocab = llm.engine.hf_config.vocab_size
            weight_bytes[label] = sum(p.numel() * p.element_size() for p in llm.engine.model.parameters())
            measure(llm, random_prompt_ids(vocab, 2, 16, seed=9), 2)  # warm-up
            long = random_prompt_ids(vocab, args.prefill_prompts, args.prefill_len, seed=1)
            prefill_s, _ = measure(llm, long, 1)
            prefill[label] = sum(map(len, long)) / prefill_s
        short = random_prompt_ids(vocab, args.decode_prompts, 16, seed=2)
        for _ in range(args.decode_rounds):
            for label, llm in llms.items():
                decode_s, generated = measure(llm, short, args.decode_len)
                decode[label].append(generated / decode_s)
        rows = [(label, weight_bytes[label], statistics.median(decode[label]), prefill[label]) for label in variants]
    print(
        f"random-weight Llama, {MODEL['num_hidden_layers']} layers, hidden {MODEL['hidden_size']}, bf16 activations, "
        f"{torch.get_num_threads()} threads; prefill {args.prefill_prompts}x{args.prefill_len} tokens, "
        f"decode {args.decode_prompts} prompts x {args.decode_len} tokens"
        + (f", median of {args.decode_rounds} alternating rounds" if args.decode_rounds > 1 else "")
    )
    print(f"{'weights':<14}{'weight MiB':>12}{'decode tok/s':>14}{'prefill tok/s':>15}")
    for label, weight_bytes, decode, prefill in rows:
        print(f"{label:<14}{weight_bytes / 2**20:>12.1f}{decode:>14.1f}{prefill:>15.1f}")


if __name__ == "__main__":
    main()
