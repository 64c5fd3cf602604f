"""Offline throughput on the embedded SmolLM2: kvserve vs HF transformers ``generate``, same run.

Both generate exactly ``--output-len`` greedy tokens for the same chat prompts in fp32;
HF runs one padded batch (its fastest offline mode), kvserve its continuous batching.
Prints tokens/s for each and the ratio.
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

from kvserve import LLM, SamplingParams

TOPICS = ["the ocean", "mountains", "a city at night", "rain", "the moon", "coffee", "trains", "libraries"]


def prompts(tokenizer, count: int) -> list[list[int]]:
    asks = ["Write a short poem about {}.", "Explain {} to a child.", "List three facts about {}.", "Describe {}."]
    texts = [asks[i % len(asks)].format(TOPICS[i % len(TOPICS)]) for i in range(count)]
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for t in texts
    ]


def run_kvserve(llm: LLM, prompt_ids: list[list[int]], output_len: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate(prompt_ids, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == output_len for o in outputs)
    return elapsed


def run_hf(path: str, prompt_ids: list[list[int]], output_len: int, pad_id: int) -> float:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    width = max(len(p) for p in prompt_ids)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids, attention_mask=mask, do_sample=False,
            max_new_tokens=output_len, min_new_tokens=output_len, pad_token_id=pad_id,
        )  # fmt: skip
    elapsed = time.perf_counter() - start
    assert out.shape[1] == width + output_len
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    args = parser.parse_args()

    llm = LLM(max_model_len=2048)
    tokenizer = llm.get_tokenizer()
    prompt_ids = prompts(tokenizer, args.num_prompts)
    run_kvserve(llm, prompt_ids[:2], 4)  # warm-up
    kv_time = run_kvserve(llm, prompt_ids, args.output_len)
    hf_time = run_hf(llm.engine.model_path, prompt_ids, args.output_len, tokenizer.pad_token_id or 0)

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
