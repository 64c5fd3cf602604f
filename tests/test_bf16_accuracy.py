"""bfloat16 accuracy against HF transformers, on the embedded SmolLM2 with the kernels that run here.

The reference is HF's float32 model (loading the same GGUF). Over chat prompts each followed by
HF's float32 greedy continuation, every token's logprob is computed teacher-forced by HF in
float32, by HF in bfloat16 and by kvserve in bfloat16 (``prompt_logprobs``: one prefill, so the
prompt's chunks and the continuation run the prefill kernels) and again by kvserve decoding the
continuation token by token (the decode kernels). kvserve's bfloat16 error must stay within a
stated multiple of HF's own bfloat16 error: bf16 noise is expected, an error bigger than the
framework's own is a kernel bug. kvserve runs the GGUF dequantized (``quantization="none"``), as HF
does: the dense bfloat16 kernels; the packed GGUF's own bounds are tested in plugins/quant/gguf.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from kvserve import LLM, SamplingParams
from kvserve.loader.default_model import embedded_gguf_path

QUESTIONS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue, and mention what Rayleigh scattering is.",
    "Write a haiku about the sea.",
    "List three primary colors.",
]
CONTINUATION = 24
BOUND = 1.5  # kvserve's mean |logprob error| may be at most this multiple of HF bf16's (plus ABS_SLACK)
ABS_SLACK = 0.01


@pytest.fixture(scope="module")
def sequences_and_reference():
    gguf = embedded_gguf_path()
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    sequences = []
    for question in QUESTIONS:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        with torch.no_grad():
            out = hf32.generate(
                torch.tensor([prompt]), do_sample=False, max_new_tokens=CONTINUATION, min_new_tokens=CONTINUATION
            )
        sequences.append((len(prompt), out[0].tolist()))
    hf16 = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    return sequences, [_hf_logprobs(hf32, s) for _, s in sequences], [_hf_logprobs(hf16, s) for _, s in sequences]


def _hf_logprobs(model, sequence: list[int]) -> torch.Tensor:
    """float32 logprob of each token after the first, teacher-forced."""
    with torch.no_grad():
        logits = model(torch.tensor([sequence])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(sequence[1:])[:, None])[:, 0]


def _force(tokens: list[int]):
    """A logits processor choosing ``tokens`` in turn: one decode step per token of the HF continuation."""

    def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        chosen = torch.full_like(logits, float("-inf"))
        chosen[tokens[len(output_ids)]] = 0.0
        return chosen

    return force


def _mean_error(ours: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    return torch.cat([(a - b).abs() for a, b in zip(ours, reference)]).mean().item()


def test_bf16_prefill_logprobs_are_as_close_to_fp32_as_hf_bf16_is(sequences_and_reference):
    sequences, ref32, ref16 = sequences_and_reference
    # chunked: the kernels see context
    llm = LLM(dtype="bfloat16", quantization="none", max_model_len=512, max_num_batched_tokens=32)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate([s for _, s in sequences], params, use_tqdm=False)
    ours = [
        torch.tensor([entry[token].logprob for entry, token in zip(o.prompt_logprobs[1:], s[1:])])
        for o, (_, s) in zip(outputs, sequences)
    ]
    hf_error, our_error = _mean_error(ref16, ref32), _mean_error(ours, ref32)
    print(f"prefill: mean |logprob - HF fp32|: HF bf16 {hf_error:.4f}, kvserve bf16 {our_error:.4f}")
    assert our_error <= BOUND * hf_error + ABS_SLACK, (our_error, hf_error)


def test_bf16_decode_logprobs_are_as_close_to_fp32_as_hf_bf16_is(sequences_and_reference):
    sequences, ref32, ref16 = sequences_and_reference
    llm = LLM(dtype="bfloat16", quantization="none", max_model_len=512)
    prompts, params = [], []
    for prompt_len, sequence in sequences:
        prompts.append(sequence[:prompt_len])
        forced = sequence[prompt_len:]
        params.append(
            SamplingParams(temperature=0, max_tokens=len(forced), logprobs=0, logits_processors=[_force(forced)])
        )
    outputs = llm.generate(prompts, params, use_tqdm=False)  # one batch: the decodes run together
    ours = []
    for output, (prompt_len, sequence) in zip(outputs, sequences):
        assert list(output.outputs[0].token_ids) == sequence[prompt_len:]
        # Reported logprobs are the model's, before the processor forced the token.
        ours.append(torch.tensor([lp[t].logprob for lp, t in zip(output.outputs[0].logprobs, sequence[prompt_len:])]))
    hf32 = [r[prompt_len - 1 :] for r, (prompt_len, _) in zip(ref32, sequences)]
    hf16 = [r[prompt_len - 1 :] for r, (prompt_len, _) in zip(ref16, sequences)]
    hf_error, our_error = _mean_error(hf16, hf32), _mean_error(ours, hf32)
    print(f"decode: mean |logprob - HF fp32|: HF bf16 {hf_error:.4f}, kvserve bf16 {our_error:.4f}")
    assert our_error <= BOUND * hf_error + ABS_SLACK, (our_error, hf_error)
