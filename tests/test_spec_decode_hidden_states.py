"""The EAGLE seam: a proposer with ``uses_hidden_states`` gets the target's final hidden states.

A randomly initialised EAGLE-style head (no trained one exists for these models) drafts from them:
its drafts are mostly wrong, and outputs must still be exactly those without speculation. The rows it
is handed are checked against HF transformers' own last hidden states at the same positions, so the
seam is shown to hand over the right states, row for row, with one and with two tensor-parallel ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from transformers import AutoModelForCausalLM

from kvserve import LLM, SamplingParams
from kvserve.interfaces.proposer import DraftProposer, DraftRequest
from kvserve.testing.hf_models import build_tiny_model

TINY = {"dtype": "float32", "max_model_len": 96, "num_kv_blocks": 96}
PROMPTS = [[3 + i, 40 + 2 * i, 7, 100 + i, 9][: 2 + i % 4] for i in range(8)]


class RandomEagleHead(DraftProposer):
    """EAGLE's drafting loop with random weights: ``f = tanh([h; e(token)] W)``, draft ``argmax(f U)``,
    then ``f`` stands in for the next position's state. Records every hidden-state row it is given."""

    name = "random-eagle-head"
    uses_hidden_states = True

    def __init__(self, config, vocab_size: int, hidden_size: int) -> None:
        super().__init__(config, vocab_size)
        generator = torch.Generator().manual_seed(0)
        self.embed = torch.randn(vocab_size, hidden_size, generator=generator)
        self.fuse = torch.randn(2 * hidden_size, hidden_size, generator=generator) / math.sqrt(2 * hidden_size)
        self.unembed = torch.randn(hidden_size, vocab_size, generator=generator)
        self.seen: dict[tuple[int, ...], dict[int, torch.Tensor]] = {}
        """Prompt -> output index -> the row the token at that index was sampled from."""

    def propose(self, requests: Sequence[DraftRequest], num_tokens: Sequence[int]) -> list[list[int]]:
        drafts = []
        for request, k in zip(requests, num_tokens):
            rows, output = request.hidden_states, request.output_token_ids
            assert rows is not None and rows.ndim == 2 and 1 <= rows.shape[0] <= len(output)
            seen = self.seen.setdefault(tuple(request.prompt_token_ids), {})
            for j in range(rows.shape[0]):
                seen[len(output) - rows.shape[0] + j] = rows[j].clone()
            state, token, proposed = rows[-1].float(), output[-1], []
            for _ in range(k):
                state = torch.tanh(torch.cat([state, self.embed[token]]) @ self.fuse)
                token = int(torch.argmax(state @ self.unembed))
                proposed.append(token)
            drafts.append(proposed)
        return drafts


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(build_tiny_model("llama", tmp_path_factory.mktemp("llama")))


def generate(llm: LLM, params: SamplingParams) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def with_random_head(path: str, **fields) -> tuple[LLM, RandomEagleHead]:
    llm = LLM(path, **{**TINY, **fields}, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    speculator = llm.engine.speculator
    head = RandomEagleHead(speculator.config, speculator.proposer.vocab_size, llm.engine.hf_config.hidden_size)
    speculator.proposer = head
    return llm, head


def check_rows_against_hf(path: str, head: RandomEagleHead, outputs: list[list[int]]) -> int:
    """Every row the head saw equals HF's last hidden state at the position its token was sampled
    from (the prompt's and earlier outputs' tokens before it); returns how many rows were checked."""
    hf = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    checked = 0
    for prompt, output in zip(PROMPTS, outputs):
        rows = head.seen[tuple(prompt)]
        with torch.no_grad():
            states = hf(torch.tensor([prompt + output]), output_hidden_states=True).hidden_states[-1][0]
        for m, row in rows.items():
            torch.testing.assert_close(row.float(), states[len(prompt) + m - 1], atol=1e-4, rtol=1e-4)
            checked += 1
    return checked


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
    SamplingParams(temperature=1.0, seed=5, max_tokens=24, ignore_eos=True),
], ids=["greedy", "seeded"])  # fmt: skip
def test_a_random_eagle_head_drafts_from_the_targets_states_and_outputs_stay_exact(llama, params):
    expected = generate(LLM(llama, **TINY), params)
    llm, head = with_random_head(llama)
    assert generate(llm, params) == expected
    assert llm.engine.speculator.stats.num_draft_tokens > 0
    assert llm.engine.kv_cache_manager.num_free_blocks() == TINY["num_kv_blocks"]
    assert check_rows_against_hf(llama, head, expected) >= len(PROMPTS) * 2


def test_two_tensor_parallel_ranks_hand_over_the_same_states(llama):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    expected = generate(LLM(llama, **TINY), params)
    llm, head = with_random_head(llama, tensor_parallel_size=2)
    try:
        assert generate(llm, params) == expected
        assert check_rows_against_hf(llama, head, expected) >= len(PROMPTS)
    finally:
        llm.engine.shutdown()


def test_proposers_that_do_not_ask_get_no_states(llama):
    llm = LLM(llama, **TINY, speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert not llm.engine.speculator.uses_hidden_states
    seen = []
    original = llm.engine.speculator.proposer.propose
    llm.engine.speculator.proposer.propose = lambda requests, k: seen.extend(requests) or original(requests, k)
    generate(llm, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert seen and all(r.hidden_states is None for r in seen)
