"""The model's generation_config.json sampling defaults over the real server and the official client:
requests that leave a field unset get the model's value, their own otherwise (as vLLM's
``--generation-config auto``); ``vllm`` ignores the file; ``override_generation_config`` merges over it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import GenerationConfig

from kvserve.config import EngineConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.sampling_params import SamplingParams
from kvserve.server import ServerThread

MODEL_DEFAULTS = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1}
MAX_NEW_TOKENS = 12
SAMPLING_FIELDS = (*MODEL_DEFAULTS, "max_tokens")
MODEL_NAME = "sampling-model"
MESSAGES = [{"role": "user", "content": "hello"}]


class RecordParams:
    """Keeps the SamplingParams of every request the engine is given (run on the engine as ``core_setup``)."""

    def __init__(self) -> None:
        self.seen: list[SamplingParams] = []

    def __call__(self, engine: Any) -> None:
        add_request = engine.add_request

        def recording_add_request(request_id: str, request: Any) -> None:
            self.seen.append(request.params)
            add_request(request_id, request)

        engine.add_request = recording_add_request


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server tests' tiny model (its chat template too) with a generation config that samples."""
    path = tmp_path_factory.mktemp("sampling-model")
    for file in tiny_model_dir.iterdir():
        (path / file.name).symlink_to(file)
    (path / "generation_config.json").unlink(missing_ok=True)
    GenerationConfig(do_sample=True, max_new_tokens=MAX_NEW_TOKENS, **MODEL_DEFAULTS).save_pretrained(path)
    return path


Served = Callable[..., Any]


@pytest.fixture(scope="module")
def served(model_dir: Path, make_server: Callable[..., ServerThread]) -> Iterator[Served]:
    """``with served(**config_fields) as (client, recorder):`` a server over the model with these config fields."""

    @contextmanager
    def serve(**config_fields: Any) -> Iterator[tuple[openai.OpenAI, RecordParams]]:
        recorder = RecordParams()
        config = EngineConfig.from_flat(model=str(model_dir), dtype="float32", **config_fields)
        llm = AsyncLLM.from_config(config, core_setup=recorder)
        try:
            with make_server(llm, served_model_name=MODEL_NAME) as server:
                yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0), recorder
        finally:
            llm.shutdown()

    yield serve


def _sampling(params: SamplingParams) -> dict[str, Any]:
    return {name: getattr(params, name) for name in SAMPLING_FIELDS}


def test_unset_fields_get_the_models_defaults_and_set_ones_keep_their_own(served: Served) -> None:
    with served() as (client, recorder):
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES)
        client.completions.create(model=MODEL_NAME, prompt="hello")
        # null is unset too; max_tokens above the model's max_new_tokens is capped to it, as vLLM's server does.
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=None, max_tokens=100)
        client.chat.completions.create(
            model=MODEL_NAME, messages=MESSAGES, temperature=0.2, top_p=0.5, max_tokens=5,
            extra_body={"top_k": 3, "min_p": 0.0, "repetition_penalty": 1.0},
        )  # fmt: skip
        client.completions.create(model=MODEL_NAME, prompt="hello", temperature=0, max_tokens=4)
    models = {**MODEL_DEFAULTS, "max_tokens": MAX_NEW_TOKENS}
    assert [_sampling(params) for params in recorder.seen] == [
        models,
        models,  # the completions endpoint's own default max_tokens (16) capped to max_new_tokens as well
        models,
        {"temperature": 0.2, "top_p": 0.5, "top_k": 3, "min_p": 0.0, "repetition_penalty": 1.0, "max_tokens": 5},
        {**models, "temperature": 0.0, "max_tokens": 4},
    ]


def test_vllm_ignores_the_models_generation_config(served: Served) -> None:
    with served(generation_config="vllm") as (client, recorder):
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=3)
        client.completions.create(model=MODEL_NAME, prompt="hello")
    neutral = SamplingParams()
    assert [_sampling(params) for params in recorder.seen] == [
        {**_sampling(neutral), "max_tokens": 3},
        _sampling(neutral),  # 16: the completions endpoint's own default
    ]


def test_overrides_merge_over_the_models_defaults(served: Served) -> None:
    with served(override_generation_config='{"temperature": 0.3, "top_k": 7, "max_new_tokens": 2}') as (client, rec):
        client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, top_p=0.8)
    assert [_sampling(params) for params in rec.seen] == [
        {**MODEL_DEFAULTS, "temperature": 0.3, "top_k": 7, "top_p": 0.8, "max_tokens": 2}
    ]


def test_an_engine_in_its_own_process_hands_the_defaults_to_the_server(
    model_dir: Path, make_server: Callable[..., ServerThread]
) -> None:
    config = EngineConfig.from_flat(model=str(model_dir), dtype="float32", engine_process=True)
    llm = AsyncLLM.from_config(config)
    try:
        assert llm.info.default_sampling_fields == {**MODEL_DEFAULTS, "max_tokens": MAX_NEW_TOKENS}
        with make_server(llm, served_model_name=MODEL_NAME) as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
            reply = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=100)
        assert reply.usage.completion_tokens <= MAX_NEW_TOKENS  # the model's max_new_tokens capped it
    finally:
        llm.shutdown()
