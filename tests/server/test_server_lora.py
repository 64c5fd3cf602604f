"""LoRA adapters over the OpenAI API: ``--lora-modules`` adapters are models of their own, listed with
their parent, picked by a request's ``model``, and answer as ``peft``'s ``PeftModel`` does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from kvserve.config import EngineConfig
from kvserve.errors import ConfigError
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.testing.hf_models import build_lora_adapter, hf_greedy

from .conftest import MODEL_NAME, start_server

PROMPT = "Paris is the capital of"
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("server-lora")
    return {
        "sql": build_lora_adapter(
            tiny_model_dir, root / "sql", 1, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]
        ),
        "chat": build_lora_adapter(
            tiny_model_dir, root / "chat", 2, r=4, lora_alpha=8, target_modules=["o_proj", "down_proj"], use_rslora=True
        ),
    }


@pytest.fixture(scope="module")
def lora_llm(tiny_model_dir: Path) -> Iterator[AsyncLLM]:
    config = EngineConfig.from_flat(model=str(tiny_model_dir), dtype="float32", enable_lora=True, max_loras=2)
    llm = AsyncLLM.from_config(config)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def lora_server(lora_llm: AsyncLLM, adapters: dict[str, Path]):
    modules = [
        "sql=" + str(adapters["sql"]),
        f'{{"name": "chat", "path": "{adapters["chat"]}", "base_model_name": "tiny-base"}}',
    ]
    with start_server(lora_llm, lora_modules=modules) as running:
        yield running


def test_models_list_adapters_with_their_parent(lora_server, adapters) -> None:
    client = openai.OpenAI(base_url=f"{lora_server.url}/v1", api_key="unused", max_retries=0)
    cards = {card.id: card.model_dump() for card in client.models.list().data}
    assert set(cards) == {MODEL_NAME, "sql", "chat"}
    assert cards["sql"]["parent"] == MODEL_NAME and cards["sql"]["root"] == str(adapters["sql"])
    assert cards["chat"]["parent"] == "tiny-base"
    assert "parent" not in cards[MODEL_NAME]


def test_model_field_picks_the_adapter(lora_server, adapters, tiny_model_dir) -> None:
    """Each adapter's greedy completion is PeftModel's; the base model's is HF's; an unknown name is a 404."""
    client = openai.OpenAI(base_url=f"{lora_server.url}/v1", api_key="unused", max_retries=0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt_ids = [tokenizer.encode(PROMPT)]
    for model, adapter in [(MODEL_NAME, None), ("sql", adapters["sql"]), ("chat", adapters["chat"])]:
        [(expected, expected_logprobs)] = hf_greedy(tiny_model_dir, prompt_ids, NEW_TOKENS, adapter)
        answer = client.completions.create(
            model=model, prompt=prompt_ids[0], max_tokens=NEW_TOKENS, temperature=0, logprobs=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert answer.model == model
        logprobs = answer.choices[0].logprobs
        assert logprobs.tokens == [tokenizer.decode([t]) for t in expected], model
        assert logprobs.token_logprobs == pytest.approx(expected_logprobs, abs=1e-3), model
    with pytest.raises(openai.NotFoundError, match="'nope' does not exist"):
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    with httpx.Client(base_url=lora_server.url, timeout=30) as http:
        assert http.get("/health").status_code == 200


def test_a_missing_adapter_stops_the_start(lora_llm, tmp_path) -> None:
    with pytest.raises(ValueError, match="LoRA adapter 'gone'.*no such directory"):
        start_server(lora_llm, lora_modules=[f"gone={tmp_path / 'gone'}"])


def test_lora_modules_need_enable_lora(tiny_model_dir) -> None:
    with pytest.raises(ConfigError, match="lora_modules needs enable_lora"):
        EngineConfig.from_flat(model=str(tiny_model_dir), lora_modules=["a=/x"])
