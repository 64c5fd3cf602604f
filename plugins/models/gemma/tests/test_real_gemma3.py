"""The real Gemma-3-270M (Q4_K_M GGUF from its wheels) through kvserve's GGUF loader and engine.

Compared with the reference of ``conftest.py`` (transformers' Gemma3ForCausalLM on an HF directory
built from the same file without kvserve's loader; its docstring says why transformers' own
GGUF loading looked broken). Skips when the wheels are not installed; about a minute on 2 cores.
"""

from __future__ import annotations

import time

import pytest
import torch

from kvserve import LLM, SamplingParams
from kvserve.chat_template import ChatTemplateError
from kvserve.testing.paged_model import PagedSequences

QUESTION = "What is the capital of France?"
# The tokenizer read from the GGUF: BOS, then SentencePiece pieces without a leading space.
QUESTION_IDS = [2, 3689, 563, 506, 5279, 529, 7001, 236881]
NEW_TOKENS = 12
LOGITS_ATOL = 1e-3
"""Both sides run float32 on the same dequantized weights (measured: 2.5e-5; logits reach ~29)."""


@pytest.fixture(scope="module")
def llm(gemma3_gguf):
    start = time.perf_counter()
    # quantization="none": the parity of the loader's mapping on dequantized weights (kvserve-quant-gguf's
    # tests check its packed layers against this path).
    llm = LLM(str(gemma3_gguf), dtype="float32", quantization="none", max_model_len=256, num_kv_blocks=64)
    print(f"kvserve opened {gemma3_gguf.name} in {time.perf_counter() - start:.1f}s")
    return llm


@pytest.fixture(scope="module")
def reference(gemma3_reference):
    return gemma3_reference


def test_answers_paris_with_the_reference_tokens(llm, reference):
    assert llm.get_tokenizer()(QUESTION).input_ids == QUESTION_IDS
    out = llm.generate(QUESTION, SamplingParams(temperature=0, max_tokens=NEW_TOKENS), use_tqdm=False)[0].outputs[0]
    print(f"{QUESTION!r} -> {out.text!r}")
    assert "Paris" in out.text
    with torch.no_grad():
        expected = reference.generate(torch.tensor([QUESTION_IDS]), do_sample=False, max_new_tokens=NEW_TOKENS)
    assert list(out.token_ids) == expected[0, len(QUESTION_IDS) :].tolist()


def test_logits_match_the_reference(llm, reference):
    tokens = QUESTION_IDS + [108, 818, 5279, 529, 7001, 563, 9079, 236761]  # "\n\nThe capital of France is Paris."
    runner = PagedSequences(llm.engine.model, 1, num_blocks=16)
    ours = torch.cat([runner.step({0: tokens[:5]})[0], runner.step({0: tokens[5:]})[0]])
    with torch.no_grad():
        expected = reference(torch.tensor([tokens])).logits[0]
    error = float((ours - expected).abs().max())
    largest = float(expected.abs().max())
    print(f"max |logit difference| over {len(tokens)} positions: {error:.2e} (logits up to {largest:.1f})")
    assert error <= LOGITS_ATOL


def test_chat_is_refused_the_base_model_has_no_template(llm):
    """The GGUF is the pretrained model and carries no chat template (see conftest.py)."""
    with pytest.raises(ChatTemplateError, match="no chat template"):
        llm.chat([{"role": "user", "content": QUESTION}], SamplingParams(temperature=0, max_tokens=4))
