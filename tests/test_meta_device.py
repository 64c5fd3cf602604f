"""Every tensor the step loop creates names its device: with the default device set to "meta"
(where a tensor made without a device lands, and any use of it with real data fails loudly),
generation gives the same tokens as a normal run."""

import pytest
import torch

from kvserve.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.frontend.parallel_sampling import ParentRequest
from kvserve.sampling_params import SamplingParams
from kvserve.testing.hf_models import build_tiny_model

PROMPTS = [[5, 17, 33, 2, 9, 41, 8], [60, 3], [12, 12, 12, 7, 19, 23, 4, 4, 1, 30, 2]]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("meta-device"))


def generate(path, params: list[SamplingParams], default_device: str | None) -> list[tuple]:
    """Completions (tokens, logprobs) and prompt logprobs per prompt; the engine is built normally, the step loop runs
    under ``default_device``.

    Small blocks, a chunked-prefill budget and a cache that forces preemption put every path of
    the runner (mixed prefill/decode batches, chunks, recompute) under the default device.
    """
    config = EngineConfig.from_flat(
        model=str(path), dtype="float32", max_model_len=32, block_size=4, num_kv_blocks=9, max_num_batched_tokens=8
    )
    engine = LLMEngine(config)
    parents = {}  # the front end's part: each request fanned out into its samples
    for i, (prompt, p) in enumerate(zip(PROMPTS, params)):
        parent = ParentRequest(str(i), engine.check_request(prompt, p))
        for child_id, child in parent.children.items():
            parents[child_id] = parent
            engine.add_request(child_id, child)
    results: dict[str, tuple] = {}
    previous = torch.get_default_device()
    if default_device is not None:
        torch.set_default_device(default_device)
    try:
        while engine.has_unfinished_requests():
            for child_output in engine.step():
                output = parents[child_output.request_id].add(child_output)
                if output is not None and output.finished:
                    completions = [(list(c.token_ids), c.logprobs) for c in output.outputs]
                    results[output.request_id] = (completions, output.prompt_logprobs)
    finally:
        torch.set_default_device(previous)
    assert engine.num_preemptions > 0, "the cache was meant to force a preemption"
    return [results[str(i)] for i in range(len(PROMPTS))]


def test_greedy_generation_creates_no_tensor_without_a_device(model_path):
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)] * len(PROMPTS)
    expected = generate(model_path, params, None)
    assert generate(model_path, params, "meta") == expected


def test_prompt_logprobs_create_no_tensor_without_a_device(model_path):
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=2)] * len(PROMPTS)
    expected = generate(model_path, params, None)
    assert all(logprobs and logprobs[0] is None and logprobs[1] for _, logprobs in expected)
    assert generate(model_path, params, "meta") == expected


def test_seeded_sampling_penalties_and_logprobs_create_no_tensor_without_a_device(model_path):
    params = [
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=1.0, min_p=0.05, seed=11, n=2, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, repetition_penalty=1.3, presence_penalty=0.5, max_tokens=12, ignore_eos=True),
    ]
    expected = generate(model_path, params, None)
    assert generate(model_path, params, "meta") == expected
