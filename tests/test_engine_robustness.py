"""Issue 9, engine side: one request's failure stays its own; the engine's bugs found by reading the code."""

from __future__ import annotations

import pytest

from kvserve import LLM, SamplingParams
from kvserve.errors import CapacityError, EngineDeadError
from kvserve.testing.hf_models import build_tiny_model

PROMPT = "Paged attention stores keys and values in fixed size blocks"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("robust"))


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), max_model_len=128, num_kv_blocks=96, block_size=16)


def greedy(llm: LLM, prompt=PROMPT, max_tokens: int = 12, **fields) -> list[int]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **fields)
    return llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids


def all_blocks_free(llm: LLM) -> bool:
    manager = llm.engine.kv_cache_manager
    return manager.num_free_blocks() == manager.num_blocks - 1 and not llm.engine.has_unfinished_requests()


# -- validation at the door ---------------------------------------------------------------
@pytest.mark.parametrize(
    "fields,name",
    [
        ({"stop_token_ids": [1_000_000_000], "min_tokens": 1}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"allowed_token_ids": [384]}, "allowed_token_ids"),
        ({"logit_bias": {-3: 1.0}}, "logit_bias"),
        ({"n": 129}, "n"),
    ],
)
def test_requests_that_used_to_kill_the_engine_are_refused_naming_the_field(llm, fields, name):
    reference = greedy(llm)
    with pytest.raises(ValueError, match=f"^{name}: "):
        llm.generate(PROMPT, SamplingParams(max_tokens=4, **fields), use_tqdm=False)
    assert all_blocks_free(llm) and greedy(llm) == reference


def test_prompt_token_ids_are_checked_and_bad_words_once_tokenized(llm):
    for prompt in ([-1], [384], [2**70]):
        with pytest.raises(ValueError, match="^prompt_token_ids: "):
            llm.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)
    with pytest.raises(CapacityError, match="max_tokens"):
        llm.generate(PROMPT, SamplingParams(max_tokens=10**30), use_tqdm=False)
    assert llm.engine.config.scheduler.max_n == 128


def test_huge_top_k_is_clamped_and_tiny_temperature_is_greedy(llm):
    reference = greedy(llm, max_tokens=6)
    huge = SamplingParams(top_k=2**63, temperature=1e-7, max_tokens=6, ignore_eos=True)
    assert llm.generate(PROMPT, huge, use_tqdm=False)[0].outputs[0].token_ids == reference


# -- LLM.generate prompt forms --------------------------------------------------------------
def test_generate_takes_vllm_prompt_forms_and_names_the_index_of_a_bad_one(llm):
    ids = llm.get_tokenizer().encode(PROMPT)
    reference = greedy(llm)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([{"prompt": PROMPT}, {"prompt_token_ids": ids}, PROMPT, ids], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [reference] * 4
    assert outs[0].prompt == PROMPT and outs[1].prompt is None
    assert llm.generate({"prompt": PROMPT}, params, use_tqdm=False)[0].outputs[0].token_ids == reference
    with pytest.raises(ValueError, match=r"prompts\[1\]: .*'prompt_tokens'"):
        llm.generate([PROMPT, {"prompt_tokens": ids}], params, use_tqdm=False)
    with pytest.raises(TypeError, match=r"prompts\[2\]: .*float"):
        llm.generate([PROMPT, ids, 3.5], params, use_tqdm=False)
    with pytest.raises(TypeError, match=r"prompts\[0\]: .*list"):
        llm.generate([[1, "a"]], params, use_tqdm=False)
    assert all_blocks_free(llm)


# -- per-request failure isolation --------------------------------------------------------------
def test_a_failing_logits_processor_aborts_its_request_and_the_bystander_completes(llm):
    reference = greedy(llm, max_tokens=16)
    calls = []

    def fails_on_the_third_token(output_ids, row):
        calls.append(len(output_ids))
        if len(output_ids) == 2:
            raise RuntimeError("processor bug")
        return row

    bad = SamplingParams(max_tokens=16, ignore_eos=True, logits_processors=[fails_on_the_third_token], n=2)
    good = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    out_bad, out_good = llm.generate([PROMPT, PROMPT], [bad, good], use_tqdm=False)
    assert out_good.outputs[0].token_ids == reference and out_good.error is None
    assert out_bad.finished and "RuntimeError: processor bug" in out_bad.error
    assert [c.finish_reason for c in out_bad.outputs] == ["abort", "abort"]
    assert all(len(c.token_ids) == 2 for c in out_bad.outputs)
    assert all_blocks_free(llm)
    assert greedy(llm, max_tokens=16) == reference  # the engine goes on


def test_a_detokenization_failure_aborts_only_that_request(llm, monkeypatch):
    from kvserve.engine import detokenizer

    reference = greedy(llm)
    original = detokenizer.IncrementalDetokenizer.add

    def add(self, token_id):
        if getattr(self, "doomed", False):
            raise ValueError("undecodable token")
        return original(self, token_id)

    monkeypatch.setattr(detokenizer.IncrementalDetokenizer, "add", add)
    engine = llm.engine
    ids = llm.get_tokenizer().encode(PROMPT)
    # ignore_eos: a sampled EOS first would finish it with "stop" before its text reaches the detokenizer.
    engine.add_request("doomed", engine.check_request(ids, SamplingParams(max_tokens=8, ignore_eos=True)))
    engine.states["doomed"].sequence.detokenizer.doomed = True
    engine.add_request(
        "bystander", engine.check_request(ids, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    )
    finals = {}
    while engine.has_unfinished_requests():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals["bystander"].outputs[0].token_ids == reference
    assert finals["doomed"].outputs[0].finish_reason == "abort" and "undecodable" in finals["doomed"].error
    assert all_blocks_free(llm)


def test_a_failing_forward_stops_the_engine_and_every_caller_gets_the_error(model_dir, monkeypatch):
    llm = LLM(str(model_dir), max_model_len=128, num_kv_blocks=32, block_size=16)
    model = llm.engine.runner.model
    forward = model.forward
    steps = []

    def dies_on_the_fourth_step(*args):
        steps.append(1)
        if len(steps) == 4:
            raise RuntimeError("device lost")
        return forward(*args)

    monkeypatch.setattr(model, "forward", dies_on_the_fourth_step)
    with pytest.raises(EngineDeadError, match="device lost"):
        llm.generate([PROMPT] * 3, SamplingParams(max_tokens=20, ignore_eos=True), use_tqdm=False)
    assert all_blocks_free(llm)
    with pytest.raises(EngineDeadError):
        llm.generate(PROMPT, SamplingParams(max_tokens=2), use_tqdm=False)


# -- the bugs of issue 9 item 3 ----------------------------------------------------------------
def test_n_samples_that_cannot_run_together_keep_their_seeded_tokens(model_dir):
    # Two usable blocks of 16: each sample of the 20-token prompt needs both, so they run in turn.
    llm = LLM(str(model_dir), max_model_len=32, num_kv_blocks=2, block_size=16)
    ids = llm.get_tokenizer().encode(PROMPT + " and the rest of the prompt")[:20]
    assert len(ids) == 20
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=4, ignore_eos=True)
    out = llm.generate([ids], params, use_tqdm=False)[0]
    assert [len(c.token_ids) for c in out.outputs] == [4, 4, 4]
    for i, completion in enumerate(out.outputs):
        alone = llm.generate([ids], params.model_copy(update={"n": 1, "seed": 5 + i}), use_tqdm=False)
        assert completion.token_ids == alone[0].outputs[0].token_ids
    assert all_blocks_free(llm)


def test_prompt_logprobs_are_not_appended_again_after_a_preemption(model_dir):
    def run(num_kv_blocks):
        llm = LLM(str(model_dir), max_model_len=128, num_kv_blocks=num_kv_blocks, block_size=4)
        ids = llm.get_tokenizer().encode(PROMPT)
        params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, prompt_logprobs=2)
        outs = llm.generate([ids, ids[1:]], params, use_tqdm=False)
        return llm.engine.num_preemptions, [len(ids), len(ids) - 1], outs

    preemptions, lengths, squeezed = run(num_kv_blocks=32)  # both need 17 blocks at the end
    assert preemptions > 0, "the cache should be too small for both requests"
    _, _, roomy = run(num_kv_blocks=96)
    for out, length, ref in zip(squeezed, lengths, roomy):
        assert len(out.prompt_logprobs) == length
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        for got, want in zip(out.prompt_logprobs[1:], ref.prompt_logprobs[1:]):
            assert {t: round(lp.logprob, 4) for t, lp in got.items()} == {
                t: round(lp.logprob, 4) for t, lp in want.items()
            }


def test_same_seed_same_tokens_alone_beside_filters_and_in_a_batch_of_64(llm):
    seeded = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True, seed=77)
    alone = llm.generate(PROMPT, seeded, use_tqdm=False)[0].outputs[0].token_ids
    beside = [SamplingParams(top_p=0.5, max_tokens=10), seeded, SamplingParams(top_k=7, max_tokens=10)]
    assert llm.generate([PROMPT] * 3, beside, use_tqdm=False)[1].outputs[0].token_ids == alone
    crowd = [SamplingParams(top_k=k % 9, top_p=0.5 + (k % 5) / 10, max_tokens=10, seed=k) for k in range(64)]
    crowd[40] = seeded
    prompts = [f"{PROMPT} {k}" for k in range(64)]
    prompts[40] = PROMPT
    assert llm.generate(prompts, crowd, use_tqdm=False)[40].outputs[0].token_ids == alone


def test_stop_token_text_is_left_out_unless_asked_for(llm):
    tokenizer = llm.get_tokenizer()
    tokens = greedy(llm, max_tokens=12)
    at = next(i for i in range(2, 12) if tokens[i] not in tokens[:i])  # a token that first occurs there
    stop = tokens[at]
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop]), use_tqdm=False)
    completion = out[0].outputs[0]
    assert completion.token_ids == tokens[: at + 1] and completion.stop_reason == stop
    assert completion.text == tokenizer.decode(tokens[:at])
    kept = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop], include_stop_str_in_output=True)
    assert llm.generate(PROMPT, kept, use_tqdm=False)[0].outputs[0].text == tokenizer.decode(tokens[: at + 1])
    # EOS with special tokens shown: its text is left out too.
    eos = llm.engine.eos_token_ids[0]
    forced = SamplingParams(temperature=0, max_tokens=8, skip_special_tokens=False, logit_bias={eos: 100.0})
    completion = llm.generate(PROMPT, forced, use_tqdm=False)[0].outputs[0]
    assert completion.token_ids == [eos] and completion.text == "" and completion.finish_reason == "stop"


def test_a_request_failing_in_the_prefill_step_it_shares_blocks_in_leaves_the_others_running(model_dir):
    # The prompts share two full blocks, computed by the first request in the very step that
    # admits the others; its processor fails in that step. That used to kill the engine (the
    # failure freed blocks the cache still counted as pending for this step).
    llm = LLM(str(model_dir), max_model_len=128, num_kv_blocks=96, block_size=16)
    prefix = list(range(3, 35))  # two full blocks
    prompts = [prefix + [40 + i, 50 + i] for i in range(3)]

    def fails_at_once(output_ids, row):
        raise RuntimeError("processor bug")

    good = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    reference = [o.outputs[0].token_ids for o in llm.generate(prompts[1:], good, use_tqdm=False)]
    llm.reset_prefix_cache()
    bad = SamplingParams(max_tokens=8, ignore_eos=True, logits_processors=[fails_at_once], n=2)  # and a follower
    outputs = llm.generate(prompts, [bad, good, good], use_tqdm=False)
    assert "RuntimeError: processor bug" in outputs[0].error
    assert [c.token_ids for c in outputs[0].outputs] == [[], []]
    assert [o.outputs[0].token_ids for o in outputs[1:]] == reference
    assert all_blocks_free(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts[1:], good, use_tqdm=False)] == reference
