"""Offline throughput on the embedded SmolLM2: kvserve vs HF transformers ``generate``, same run.

Both generate exactly ``--output-len`` greedy tokens for the same chat prompts in fp32;
HF runs one padded batch (its fastest offline mode), kvserve its continuous batching.
Prints tokens/s for each and the ratio.
"""

from __future__ import annotations

import argparse

import torch

from harness.hf_baseline import hf_generate_batched, load_hf_model
from kvserve import LLM
from kvserve.benchmarking.offline import measure_throughput
from kvserve.benchmarking.workload import chat_prompt_ids
from kvserve.testing.hf_models import embedded_hf_directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    args = parser.parse_args()

    # The HF baseline runs the GGUF dequantized in float32: so does kvserve here, like for like.
    llm = LLM(max_model_len=2048, dtype="float32", quantization="none")
    tokenizer = llm.get_tokenizer()
    prompt_ids = chat_prompt_ids(tokenizer, args.num_prompts)
    measure_throughput(llm, prompt_ids[:2], 4, progress=False)  # warm-up
    kv_time = measure_throughput(llm, prompt_ids, args.output_len, progress=False).seconds
    hf_model = load_hf_model(str(embedded_hf_directory()))
    hf_time = hf_generate_batched(hf_model, prompt_ids, args.output_len, tokenizer.pad_token_id or 0)

    tokens = args.num_prompts * args.output_len
    print(
        f"workload: {args.num_prompts} prompts x {args.output_len} tokens, SmolLM2-135M fp32, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'engine':<24}{'seconds':>10}{'output tok/s':>16}")
    print(f"{'kvserve':<24}{kv_time:>10.2f}{tokens / kv_time:>16.1f}")
    print(f"{'HF transformers':<24}{hf_time:>10.2f}{tokens / hf_time:>16.1f}")
    print(f"kvserve / HF throughput ratio: {hf_time / kv_time:.2f}x")


if __name__ == "__main__":
    main()
