"""The server on the embedded SmolLM2-135M-Instruct, with its real chat template, through the ``openai`` client."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from kvserve.config import EngineConfig, ServerConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.loader.default_model import EMBEDDED_MODEL_NAME
from kvserve.server import ServerThread, build_app

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smol() -> Iterator[openai.OpenAI]:
    llm = AsyncLLM.from_config(EngineConfig.from_flat(dtype="float32", max_model_len=512))
    try:
        with ServerThread(build_app(llm, ServerConfig(port=0))) as server:
            yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    finally:
        llm.shutdown()


def test_chat_answers_sensibly(smol: openai.OpenAI) -> None:
    out = smol.chat.completions.create(model=EMBEDDED_MODEL_NAME, messages=QUESTION, max_tokens=24, temperature=0)
    assert "Paris" in out.choices[0].message.content


def test_streamed_chat_equals_non_streamed_for_the_same_seed(smol: openai.OpenAI) -> None:
    args = dict(model=EMBEDDED_MODEL_NAME, messages=QUESTION, max_tokens=20, temperature=0.8, seed=11)
    whole = smol.chat.completions.create(**args).choices[0].message.content
    chunks = smol.chat.completions.create(**args, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
