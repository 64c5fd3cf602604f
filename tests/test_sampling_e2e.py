"""Sampling features end to end on a tiny model: logprobs vs HF, seeds, n > 1, stop strings, streaming."""

import asyncio
import random

import pytest
import torch
import transformers
from tokenizers.decoders import DecodeStream

from kvserve import LLM, SamplingParams
from kvserve.frontend.async_llm import AsyncLLM, EngineDeadError
from kvserve.frontend.parallel_sampling import ParentRequest
from kvserve.testing.hf_models import build_tiny_model

PROMPT = "Paged attention stores keys and values in fixed size blocks"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("sampling"))


@pytest.fixture(scope="module")
def llm(model_dir):
    return LLM(str(model_dir), dtype="float32", max_model_len=128, num_kv_blocks=96, block_size=16)


@pytest.fixture(scope="module")
def hf(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def test_greedy_logprobs_match_hf_at_every_step(llm, hf):
    ids = llm.get_tokenizer().encode(PROMPT)
    out = llm.generate([ids], SamplingParams(temperature=0, max_tokens=8, logprobs=5), use_tqdm=False)[0]
    completion = out.outputs[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=8, output_logits=True,
                          return_dict_in_generate=True)  # fmt: skip
    assert completion.token_ids == ref.sequences[0, len(ids) :].tolist()
    total = 0.0
    for step, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        expected = ref.logits[step][0].log_softmax(-1)
        top_values, top_ids = expected.topk(5)
        assert set(top_ids.tolist()) <= set(entry)
        for value, token_id in zip(top_values.tolist(), top_ids.tolist()):
            assert entry[token_id].logprob == pytest.approx(value, abs=1e-4)
        assert entry[token].rank == 1
        total += entry[token].logprob
    assert completion.cumulative_logprob == pytest.approx(total)


def test_prompt_logprobs_match_hf_forward_with_chunked_prefill(model_dir, hf):
    llm = LLM(
        str(model_dir), dtype="float32", max_model_len=128, num_kv_blocks=32, max_num_batched_tokens=5, block_size=4
    )
    ids = llm.get_tokenizer().encode(PROMPT)
    llm.generate([ids], SamplingParams(max_tokens=1), use_tqdm=False)  # the prompt is now prefix-cached
    out = llm.generate([ids], SamplingParams(max_tokens=1, prompt_logprobs=3), use_tqdm=False)[0]
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0].log_softmax(-1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(ids)
    for pos in range(1, len(ids)):
        entry = out.prompt_logprobs[pos]
        assert entry[ids[pos]].logprob == pytest.approx(float(expected[pos - 1, ids[pos]]), abs=1e-4)
        assert len(entry) >= 3


def test_seeded_sampling_is_the_same_alone_and_inside_a_random_batch(llm):
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=1234)
    alone = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids
    rng = random.Random(0)
    others = [tokenizer.encode(" ".join(rng.choice(PROMPT.split()) for _ in range(rng.randint(2, 20))))
              for _ in range(7)]  # fmt: skip
    prompts = others[:3] + [tokenizer.encode(PROMPT)] + others[3:]
    batch_params = [SamplingParams(temperature=0.8, max_tokens=rng.randint(1, 15)) for _ in prompts]
    batch_params[3] = params
    batch = llm.generate(prompts, batch_params, use_tqdm=False)
    assert batch[3].outputs[0].token_ids == alone


def test_stop_string_split_across_tokens(llm):
    tokenizer = llm.get_tokenizer()
    base = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)
    tokens = base[0].outputs[0].token_ids
    # Text visible after each token; a token holding half a UTF-8 character shows nothing yet.
    stream, pieces = DecodeStream(skip_special_tokens=True), [""]
    for token in tokens:
        pieces.append(pieces[-1] + (stream.step(tokenizer.backend_tokenizer, token) or ""))
    pieces = pieces[1:]
    # A stop string made of the end of token 4's text and the start of token 5's.
    boundary = len(pieces[3])
    text = pieces[-1]
    stop = text[boundary - 2 : boundary + 2]
    assert len(stop) == 4 and text.find(stop) == boundary - 2, "pick a stop string that first occurs here"
    out = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, stop=[stop]), use_tqdm=False)[0]
    completion = out.outputs[0]
    assert completion.text == text[: boundary - 2]
    assert (completion.finish_reason, completion.stop_reason) == ("stop", stop)
    completed_at = next(i for i, piece in enumerate(pieces) if stop in piece)  # generation stops right there
    assert completion.token_ids == tokens[: completed_at + 1]
    kept = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=20, stop=[stop],
                                               include_stop_str_in_output=True), use_tqdm=False)  # fmt: skip
    assert kept[0].outputs[0].text == text[: boundary + 2]


def test_streaming_deltas_add_up_and_abort_mid_stream_frees_all_blocks(llm):
    engine = llm.engine
    async_llm = AsyncLLM(engine)
    manager = engine.kv_cache_manager
    free_before = manager.num_free_blocks()

    async def stream(request_id, max_tokens, stop_after=None):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, output_kind="delta")
        text, tokens = "", []
        async for out in async_llm.generate(PROMPT, params, request_id):
            text += out.outputs[0].text
            tokens += out.outputs[0].token_ids
            if stop_after is not None and len(tokens) >= stop_after:
                break  # leaving the iterator aborts the request
        return text, tokens

    async def main():
        full, aborted = await asyncio.gather(stream("full", 16), stream("aborted", 64, stop_after=3))
        for _ in range(100):  # aborts are applied between steps
            if manager.num_free_blocks() == free_before and not engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.02)
        return full, aborted

    try:
        (text, tokens), (_, aborted_tokens) = asyncio.run(main())
    finally:
        async_llm.shutdown()
    final = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert tokens == final[0].outputs[0].token_ids and text == final[0].outputs[0].text
    assert 3 <= len(aborted_tokens) < 64
    assert manager.num_free_blocks() == free_before

    async def after_shutdown():
        return await anext(async_llm.generate(PROMPT, SamplingParams(), "late"))

    with pytest.raises(EngineDeadError, match="shut down"):
        asyncio.run(after_shutdown())


def test_an_n_request_streams_every_sample_and_aborting_it_aborts_them_all(llm):
    engine = llm.engine
    async_llm = AsyncLLM(engine)
    free_before = engine.kv_cache_manager.num_free_blocks()
    params = SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=8, ignore_eos=True, output_kind="delta")

    async def main():
        tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
        async for out in async_llm.generate(PROMPT, params, "streamed"):
            assert out.request_id == "streamed"
            for completion in out.outputs:
                tokens[completion.index] += completion.token_ids
        first = asyncio.Event()

        async def consume():
            async for _ in async_llm.generate(PROMPT, params.model_copy(update={"max_tokens": 64}), "aborted"):
                first.set()

        consumer = asyncio.create_task(consume())
        await first.wait()
        await async_llm.abort("aborted")
        for _ in range(100):  # aborts are applied between steps
            if not engine.has_unfinished_requests():
                break
            await asyncio.sleep(0.02)
        stopped = not engine.has_unfinished_requests()
        consumer.cancel()
        return tokens, stopped

    try:
        tokens, stopped = asyncio.run(main())
    finally:
        async_llm.shutdown()
    assert stopped, "every sample of the aborted request stops"
    assert engine.kv_cache_manager.num_free_blocks() == free_before
    offline = llm.generate(PROMPT, params.model_copy(update={"output_kind": "cumulative"}), use_tqdm=False)[0]
    assert [tokens[c.index] for c in offline.outputs] == [c.token_ids for c in offline.outputs]


def test_n_samples_start_from_the_first_samples_prompt_blocks_and_equal_separately_seeded_requests(model_dir):
    llm = LLM(str(model_dir), dtype="float32", max_model_len=128, num_kv_blocks=64, block_size=16)
    engine, manager = llm.engine, llm.engine.kv_cache_manager
    ids = llm.get_tokenizer().encode(" ".join([PROMPT] * 3))
    full_blocks, partial = divmod(len(ids), 16)
    assert full_blocks >= 1 and partial, "the prompt should end inside a block (its last block is not shared)"
    params = SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True)
    parent = ParentRequest("group", engine.check_request(ids, params))
    for child_id, child in parent.children.items():
        engine.add_request(child_id, child)
    merged = [parent.add(output) for output in engine.step()]  # one step: sample 0's prefill, the others beside it
    assert [len(engine.states[child_id].request.output_token_ids) for child_id in parent.children] == [1] * 4
    assert manager.stats().prefix_hits == 3 * full_blocks * 16, "samples 1-3 start from sample 0's full blocks"
    while engine.has_unfinished_requests():
        merged += [parent.add(output) for output in engine.step()]
    final = merged[-1]
    assert final.finished and final.request_id == "group" and [c.index for c in final.outputs] == [0, 1, 2, 3]
    assert manager.num_free_blocks() == 64
    for i, completion in enumerate(final.outputs):
        alone = llm.generate([ids], params.model_copy(update={"n": 1, "seed": 5 + i}), use_tqdm=False)
        assert completion.token_ids == alone[0].outputs[0].token_ids
    again = llm.generate([ids], params, use_tqdm=False)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in final.outputs], "same seed, same samples"
