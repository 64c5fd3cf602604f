"""Speculative decoding end to end: outputs with drafts are exactly those without.

Greedy fp32 with each proposer (``ngram``, ``suffix``; ``draft_model`` with a layer-skip draft on
SmolLM2) on the embedded SmolLM2 and a tiny Gemma 3 at batch sizes 1, 8 and 32, with chunked prefill
and with forced preemption; an oracle proposer (the
reference run's own tokens, so every draft is accepted) and a garbage one (random ids, so nearly
every draft is rejected) with stops crossed in the middle of a draft, logprobs, seeds, streaming
deltas, abort and grammars; ``disable_by_batch_size``; and the config errors.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError, UnknownComponentError
from kvserve.interfaces.proposer import DraftProposer, DraftRequest
from kvserve.request import RequestStatus
from kvserve.sampling_params import StructuredOutputsParams
from kvserve.structured_outputs.selection import usable_backends
from kvserve.testing.hf_models import build_tiny_model, embedded_hf_directory, layer_skip_draft

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
# The global cache on (its default): the batches run one after another in an engine draft from the earlier ones.
SUFFIX = {"method": "suffix", "num_speculative_tokens": 4}
PROPOSERS = {"ngram": NGRAM, "suffix": SUFFIX}

PASSAGES = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "Paged attention stores keys and values in fixed size blocks.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    "for i in range(10):\n    print(i)\n",
    "Continuous batching admits new requests while others are still decoding.",
    "red, green, blue, red, green, blue,",
]


def copy_prompts(count: int) -> list[str]:
    """Prompts whose continuation repeats them (what prompt lookup finds): a passage, twice, then its start."""
    return [
        f"{p}\n{p}\n{p[: 8 + i % 7]}" if i % 3 else f"Say it again: {p} Again: {p} Again:"
        for i, p in enumerate(PASSAGES[i % len(PASSAGES)] for i in range(count))
    ]


def tokens_of(llm: LLM, prompts, params) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def accepted(llm: LLM) -> int:
    return llm.engine.speculator.stats.num_accepted_tokens


GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


# -- the embedded SmolLM2 (fp32, unquantized) -------------------------------------------------------
SMOLLM = {"quantization": "none", "dtype": "float32", "max_model_len": 256}
SMOLLM_CASES = {
    "batched": {},
    "chunked-prefill": {"max_num_batched_tokens": 48},
    "preemption": {"block_size": 16, "num_kv_blocks": 40},
}


@pytest.fixture(scope="module")
def smollm_reference():
    """Greedy tokens without speculation, per batch size (batch composition is kept the same)."""
    llm = LLM(**SMOLLM)
    return {size: tokens_of(llm, copy_prompts(size), GREEDY) for size in (1, 8, 32)}


@pytest.mark.parametrize("method", sorted(PROPOSERS))
@pytest.mark.parametrize("case", sorted(SMOLLM_CASES))
def test_smollm2_greedy_is_token_identical_with_each_proposer(smollm_reference, case, method):
    llm = LLM(**SMOLLM, **SMOLLM_CASES[case], speculative_config=PROPOSERS[method])
    for size in (1, 8, 32):
        assert tokens_of(llm, copy_prompts(size), GREEDY) == smollm_reference[size], f"batch of {size}"
    assert accepted(llm) > 0, "the copy prompts should have had drafts accepted"
    if case == "preemption":
        assert llm.engine.num_preemptions > 0, "the small KV cache should have forced preemption"
        assert llm.engine.kv_cache_manager.num_free_blocks() == 40


@pytest.mark.parametrize("case", sorted(SMOLLM_CASES))
def test_smollm2_greedy_is_token_identical_with_a_layer_skip_draft(smollm_reference, tmp_path, case):
    # No smaller model shares SmolLM2's tokenizer: its own first 4 of 30 layers draft for it.
    draft = layer_skip_draft(embedded_hf_directory(), tmp_path / "draft", 4)
    spec = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}
    llm = LLM(**SMOLLM, **SMOLLM_CASES[case], speculative_config=spec)
    for size in (1, 8, 32):
        assert tokens_of(llm, copy_prompts(size), GREEDY) == smollm_reference[size], f"batch of {size}"
    assert accepted(llm) > 0, "a layer-skip draft of the same model should have some drafts accepted"
    if case == "preemption":
        assert llm.engine.num_preemptions > 0, "the small KV cache should have forced preemption"


# -- a tiny HF Gemma 3 --------------------------------------------------------------------------------
GEMMA_TINY = {"num_hidden_layers": 3, "head_dim": 32, "sliding_window": 6, "sliding_window_pattern": 3}


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return str(build_tiny_model("gemma3_text", tmp_path_factory.mktemp("gemma3"), **GEMMA_TINY))


def repeating_prompts(count: int) -> list[list[int]]:
    rng = random.Random(count)
    prompts = []
    for i in range(count):
        phrase = [rng.randrange(3, 384) for _ in range(3 + i % 4)]
        prompts.append(phrase * 3 + phrase[: 1 + i % 2])
    return prompts


@pytest.mark.parametrize(
    "engine_fields",
    [{}, {"max_num_batched_tokens": 9}, {"block_size": 4, "num_kv_blocks": 40, "max_model_len": 48}],
    ids=["batched", "chunked-prefill", "preemption"],
)
@pytest.mark.parametrize("method", sorted(PROPOSERS))
def test_tiny_gemma3_greedy_is_token_identical_with_each_proposer(gemma, engine_fields, method):
    fields = {"dtype": "float32", "max_model_len": 64, "num_kv_blocks": 128, **engine_fields}
    plain, speculative = LLM(gemma, **fields), LLM(gemma, **fields, speculative_config=PROPOSERS[method])
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    for size in (1, 8, 32):
        prompts = repeating_prompts(size)
        assert tokens_of(speculative, prompts, params) == tokens_of(plain, prompts, params), f"batch of {size}"
    assert accepted(speculative) > 0, "the repeating prompts should have had drafts accepted"
    if "block_size" in engine_fields:
        assert speculative.engine.num_preemptions > 0, "the small KV cache should have forced preemption"


# -- oracle and garbage proposers on a tiny Llama -----------------------------------------------------
class OracleProposer(DraftProposer):
    """Proposes the reference run's next tokens (and past its end, the same again): every draft is
    accepted until the reference ends, so stops fall in the middle of drafts."""

    name = "oracle"

    def __init__(self, config, vocab_size, reference: dict[tuple[int, ...], list[int]]) -> None:
        super().__init__(config, vocab_size)
        self.reference = reference

    def propose(self, requests: Sequence[DraftRequest], num_tokens: Sequence[int]) -> list[list[int]]:
        drafts = []
        for request, k in zip(requests, num_tokens):
            future = self.reference[tuple(request.prompt_token_ids)][len(request.output_token_ids) :]
            drafts.append((future + future[:1] * k)[:k])
        return drafts


class GarbageProposer(DraftProposer):
    """Random ids, random lengths up to what is asked, some out of the vocabulary or not ints."""

    name = "garbage"

    def __init__(self, config, vocab_size) -> None:
        super().__init__(config, vocab_size)
        self.rng = random.Random(0)

    def propose(self, requests: Sequence[DraftRequest], num_tokens: Sequence[int]) -> list[list[int]]:
        junk = [-1, self.vocab_size, 2**40, "7", 3.0]
        return [
            [
                self.rng.randrange(self.vocab_size) if self.rng.random() < 0.95 else self.rng.choice(junk)
                for _ in range(n)
            ]
            for n in (self.rng.randint(0, k) for k in num_tokens)
        ]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(build_tiny_model("llama", tmp_path_factory.mktemp("llama")))


TINY = {"dtype": "float32", "max_model_len": 96, "num_kv_blocks": 96}


def with_proposer(path: str, make, **fields) -> LLM:
    """An engine speculating with the proposer ``make(config, vocab_size)`` builds (in place of ngram's)."""
    llm = LLM(path, **{**TINY, **fields}, speculative_config={"method": "ngram", "num_speculative_tokens": 5})
    speculator = llm.engine.speculator
    speculator.proposer = make(speculator.config, speculator.proposer.vocab_size)
    return llm


def outputs(llm: LLM, prompts, params) -> list[tuple]:
    result = []
    for o in llm.generate(prompts, params, use_tqdm=False):
        c = o.outputs[0]
        ranks = None if c.logprobs is None else [{t: lp.rank for t, lp in entry.items()} for entry in c.logprobs]
        result.append((list(c.token_ids), c.text, c.finish_reason, c.stop_reason, ranks))
    return result


def stop_cases(reference: list[list[int]], texts: list[str]) -> list[SamplingParams]:
    """Per prompt, params that stop in the middle of where the oracle's drafts reach: max_tokens, a
    stop id, a stop string (from the reference output's text), min_tokens, logprobs and seeds."""
    cases = []
    for i, (tokens, text) in enumerate(zip(reference, texts)):
        kind = i % 6
        if kind == 0:
            cases.append(SamplingParams(temperature=0, max_tokens=7, logprobs=3))
        elif kind == 1:
            cases.append(SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[tokens[9]], ignore_eos=True))
        elif kind == 2 and len(text) > 12:
            cases.append(SamplingParams(temperature=0, max_tokens=30, stop=[text[6:9]], ignore_eos=True))
        elif kind == 3:
            cases.append(SamplingParams(temperature=0.8, top_k=20, seed=11 + i, max_tokens=30, logprobs=2))
        elif kind == 4:
            cases.append(SamplingParams(temperature=0, max_tokens=30, min_tokens=12, presence_penalty=0.7))
        else:
            cases.append(SamplingParams(temperature=1.0, seed=i, max_tokens=30, ignore_eos=True))
    return cases


@pytest.fixture(scope="module")
def tiny_reference(llama):
    """Prompts, each one's params, the outputs without speculation, and each prompt's greedy run of
    30 tokens without any stop (what the oracle proposes: stops fall inside its drafts)."""
    prompts = [[3 + i, 40 + 2 * i, 7, 100 + i, 9][: 2 + i % 4] for i in range(12)]
    plain = LLM(llama, **TINY)
    free_run = outputs(plain, prompts, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    params = stop_cases([o[0] for o in free_run], [o[1] for o in free_run])
    oracle = {tuple(p): list(o[0]) for p, o in zip(prompts, free_run)}
    return prompts, params, outputs(plain, prompts, params), oracle


def test_drafts_run_past_stops_yet_nothing_past_them_is_emitted(llama, tiny_reference):
    prompts, params, expected, oracle = tiny_reference
    llm = with_proposer(llama, lambda config, vocab: OracleProposer(config, vocab, oracle))
    assert outputs(llm, prompts, params) == expected
    stats = llm.engine.speculator.stats
    assert stats.accepted_per_position[-1] > 0, "whole drafts should have been accepted"
    assert llm.engine.kv_cache_manager.num_free_blocks() == TINY["num_kv_blocks"]


def test_garbage_drafts_still_give_exact_outputs(llama, tiny_reference):
    prompts, params, expected, _ = tiny_reference
    llm = with_proposer(llama, GarbageProposer)
    assert outputs(llm, prompts, params) == expected
    assert llm.engine.speculator.stats.num_draft_tokens > 0
    assert llm.engine.kv_cache_manager.num_free_blocks() == TINY["num_kv_blocks"]


def test_a_step_streams_its_accepted_tokens_as_one_delta_and_abort_frees_everything(llama, tiny_reference):
    prompts, _, _, oracle = tiny_reference
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, output_kind="delta")
    llm = with_proposer(llama, lambda config, vocab: OracleProposer(config, vocab, oracle))
    engine = llm.engine
    for i, prompt in enumerate(prompts[:2]):
        engine.add_request(f"r{i}", engine.check_request(prompt, params))
    deltas: dict[str, list[list[int]]] = {"r0": [], "r1": []}
    while engine.has_unfinished_requests():
        for output in engine.step():
            deltas[output.request_id] += [list(c.token_ids) for c in output.outputs]
            if output.request_id == "r1" and sum(map(len, deltas["r1"])) >= 10:
                engine.abort_request("r1")
    assert [t for d in deltas["r0"] for t in d] == oracle[tuple(prompts[0])]
    assert max(len(d) for d in deltas["r0"]) == 6, "a step emits its 5 accepted drafts and the bonus at once"
    assert "r1" not in engine.states and engine.kv_cache_manager.num_free_blocks() == TINY["num_kv_blocks"]


def test_above_disable_by_batch_size_no_drafts_are_made(llama):
    prompts = repeating_prompts(6)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = tokens_of(LLM(llama, **TINY), prompts, params)
    spec = {**NGRAM, "disable_by_batch_size": 2}
    crowded = LLM(llama, **TINY, speculative_config=spec)
    assert tokens_of(crowded, prompts, params) == expected
    assert crowded.engine.speculator.stats.num_drafts == 0, "six requests ran together to the end: never two or fewer"
    few = LLM(llama, **TINY, speculative_config=spec)
    assert tokens_of(few, prompts[:2], params) == expected[:2]
    assert few.engine.speculator.stats.num_drafts > 0


# -- grammars -----------------------------------------------------------------------------------------
@pytest.mark.skipif(not usable_backends(), reason="no structured output backend installed")
def test_a_grammar_rolls_back_with_rejected_drafts():
    """SmolLM2 under a JSON schema and a choice, greedy and sampled, with drafts from an oracle of its
    unconstrained answer (mostly outside the grammar: rejected, rolled back) and of its constrained
    one (accepted up to its EOS, which ends the grammar): exactly as without drafts."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
    backend = usable_backends()[0]
    fields = {**SMOLLM, "structured_outputs_config": {"backend": backend, "disable_any_whitespace": True}}
    plain = LLM(**fields)
    tokenizer = plain.get_tokenizer()
    question = [{"role": "user", "content": "Give a person as JSON: name and age."}]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True))
    constraints = [{"json": schema}, {"json": schema}, {"choice": ["yes", "no", "maybe so"]}]
    params = [
        SamplingParams(temperature=t, seed=5, max_tokens=32, structured_outputs=StructuredOutputsParams(**c))
        for c, t in zip(constraints, (0.0, 0.9, 0.0))
    ]
    expected = outputs(plain, [prompt] * len(params), params)
    free_tokens = outputs(plain, [prompt], SamplingParams(temperature=0, max_tokens=32))[0][0]
    llm = LLM(**fields, speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    speculator = llm.engine.speculator
    for oracle in (free_tokens, expected[0][0]):
        speculator.proposer = OracleProposer(speculator.config, speculator.proposer.vocab_size, {tuple(prompt): oracle})
        assert outputs(llm, [prompt] * len(params), params) == expected
    assert (
        speculator.stats.num_accepted_tokens > 0
        and speculator.stats.num_draft_tokens > speculator.stats.num_accepted_tokens
    )


# -- configuration ------------------------------------------------------------------------------------
def test_bad_speculative_configs_are_refused_at_start_naming_the_field(llama):
    with pytest.raises(ConfigError, match=r"speculative_config\.num_speculative_tokenz: Extra inputs"):
        LLM(llama, **TINY, speculative_config={**NGRAM, "num_speculative_tokenz": 3})
    # A misspelt required field: the missing one and the unknown one are both named.
    with pytest.raises(ConfigError, match=r"num_speculative_tokens: Field required .*num_speculative_tokenz: Extra"):
        LLM(llama, **TINY, speculative_config={"method": "ngram", "num_speculative_tokenz": 3})
    with pytest.raises(ConfigError, match=r"speculative_config\.num_speculative_tokens: Field required"):
        LLM(llama, **TINY, speculative_config={"method": "ngram"})
    with pytest.raises(ConfigError, match=r"speculative_config: .*not JSON"):
        LLM(llama, **TINY, speculative_config='{"method": ngram}')
    with pytest.raises(ConfigError, match=r"prompt_lookup_min \(4\) must not exceed prompt_lookup_max \(2\)"):
        LLM(llama, **TINY, speculative_config={**NGRAM, "prompt_lookup_min": 4, "prompt_lookup_max": 2})
    with pytest.raises(ConfigError, match=r"speculative_config\.suffix_decoding_max_tree_dept: Extra inputs"):
        LLM(llama, **TINY, speculative_config={**SUFFIX, "suffix_decoding_max_tree_dept": 8})
    with pytest.raises(ConfigError, match=r"speculative_config\.suffix_decoding_max_tree_depth: Input should be"):
        LLM(llama, **TINY, speculative_config={**SUFFIX, "suffix_decoding_max_tree_depth": 1})
    with pytest.raises(UnknownComponentError, match=r"unknown proposer 'eagle'; available: .*ngram"):
        LLM(llama, **TINY, speculative_config={"method": "eagle", "num_speculative_tokens": 3})
    with pytest.raises(ConfigError, match=r"speculative_config cannot be combined with logits_processors"):
        LLM(llama, **TINY, speculative_config=NGRAM, logits_processors=["no_repeat_ngram"])


def test_preempted_requests_drop_their_drafts(llama, tiny_reference):
    prompts = tiny_reference[0]
    llm = LLM(llama, **{**TINY, "block_size": 4, "num_kv_blocks": 30, "max_model_len": 40}, speculative_config=NGRAM)
    engine = llm.engine
    checked = [engine.check_request(p, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)) for p in prompts]
    for i, request in enumerate(checked):
        engine.add_request(f"r{i}", request)
    while engine.has_unfinished_requests():
        engine.step()
        for state in engine.states.values():
            request = state.request
            if request.status in (RequestStatus.PREEMPTED, RequestStatus.WAITING):
                assert request.draft_token_ids == [], f"{request.request_id} waits holding drafts"
    assert engine.num_preemptions > 0


def test_two_tensor_parallel_ranks_verify_drafts_as_one_device_does(llama):
    prompts = repeating_prompts(8)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = tokens_of(LLM(llama, **TINY), prompts, params)
    llm = LLM(llama, **TINY, tensor_parallel_size=2, speculative_config=NGRAM)
    try:
        assert tokens_of(llm, prompts, params) == expected
        assert accepted(llm) > 0
        assert llm.engine.kv_cache_manager.num_free_blocks() == TINY["num_kv_blocks"]
    finally:
        llm.engine.shutdown()
