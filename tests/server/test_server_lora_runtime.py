"""LoRA adapters loaded and unloaded while the server runs (``--allow-runtime-lora-updating``), found by
the ``filesystem`` resolver, counted in ``/metrics``, and tokenized with the tokenizer an adapter ships."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from kvserve.config import EngineConfig
from kvserve.config_sources import load_config
from kvserve.errors import ConfigError
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.server import ServerThread
from kvserve.testing.hf_models import build_lora_adapter, build_tiny_model, hf_greedy

from .conftest import MODEL_NAME, scrape, start_server

PROMPT = "Paris is the capital of"
WEIGHTS = "adapter_model.safetensors"
ADDED_TOKEN = "<sql>"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A vocabulary larger than the tokenizer's (481 tokens): an adapter's added token has a row of its own.
    folder = tmp_path_factory.mktemp("runtime-lora-base")
    return build_tiny_model("llama", folder, vocab_size=512, max_position_embeddings=1024)


@pytest.fixture(scope="module")
def adapters(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Good adapters, bad ones, and the resolver's folder (``resolvable``) holding the adapter ``found``."""
    root = tmp_path_factory.mktemp("runtime-lora")
    made = {
        "sql": build_lora_adapter(base, root / "sql", 1, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        "chat": build_lora_adapter(base, root / "chat", 2, r=4, lora_alpha=8, target_modules=["o_proj", "down_proj"]),
        "big": build_lora_adapter(base, root / "big", 3, r=32, lora_alpha=8, target_modules=["q_proj"]),
    }
    made["ghost"] = shutil.copytree(made["sql"], root / "ghost")  # a layer the two-layer base lacks
    weights = load_file(made["ghost"] / WEIGHTS)
    save_file({key.replace("layers.1.", "layers.7."): value for key, value in weights.items()}, made["ghost"] / WEIGHTS)
    made["corrupt"] = shutil.copytree(made["sql"], root / "corrupt")
    (made["corrupt"] / WEIGHTS).write_bytes(b"not safetensors")
    made["tok"] = shutil.copytree(made["sql"], root / "tok")
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.add_tokens([ADDED_TOKEN])
    tokenizer.save_pretrained(made["tok"])
    made["resolvable"] = root / "resolvable"
    shutil.copytree(made["chat"], made["resolvable"] / "found")
    return made


def _llm(base: Path, engine_process: bool) -> AsyncLLM:
    config = EngineConfig.from_flat(
        model=str(base), dtype="float32", enable_lora=True, max_loras=2, max_num_seqs=8, engine_process=engine_process
    )
    return AsyncLLM.from_config(config)


@pytest.fixture(scope="module")
def thread_llm(base: Path) -> Iterator[AsyncLLM]:
    llm = _llm(base, engine_process=False)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def thread_server(thread_llm: AsyncLLM, adapters: dict[str, Path]) -> Iterator[ServerThread]:
    fields = dict(allow_runtime_lora_updating=True, lora_resolver_cache_dir=str(adapters["resolvable"]))
    with start_server(thread_llm, **fields) as running:
        yield running


@pytest.fixture(scope="module")
def process_server(base: Path) -> Iterator[ServerThread]:
    llm = _llm(base, engine_process=True)
    with start_server(llm, allow_runtime_lora_updating=True) as running:
        yield running
    llm.shutdown()


def _client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _load(http: httpx.Client, name: str, path: Path) -> httpx.Response:
    return http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)})


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_load_serve_refuse_and_unload(request, mode, base, adapters) -> None:
    """A loaded adapter is listed and answers as peft's PeftModel; bad loads are 400s naming the problem
    and the server serves on; an unloaded adapter is a 404, as is unloading it again."""
    server = request.getfixturevalue(f"{mode}_server")
    client = _client(server)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert _load(http, "sql", adapters["sql"]).status_code == 200
        card = {card.id: card for card in client.models.list().data}["sql"].model_dump()
        assert card["root"] == str(adapters["sql"]) and card["parent"] == MODEL_NAME
        tokenizer = AutoTokenizer.from_pretrained(base)
        prompt_ids = tokenizer.encode(PROMPT)
        [(expected, _)] = hf_greedy(base, [prompt_ids], 4, adapters["sql"])
        answer = client.completions.create(
            model="sql", prompt=prompt_ids, max_tokens=4, temperature=0, logprobs=0, extra_body={"ignore_eos": True}
        )
        assert answer.model == "sql"
        assert answer.choices[0].logprobs.tokens == [tokenizer.decode([t]) for t in expected]

        for name, path, words in [
            ("sql", adapters["chat"], "'sql' is already served"),
            (MODEL_NAME, adapters["chat"], f"'{MODEL_NAME}' is already served"),
            ("gone", adapters["sql"].parent / "gone", "no such directory"),
            ("big", adapters["big"], "rank r=32 exceeds max_lora_rank=16"),
            ("ghost", adapters["ghost"], "module 'model.layers.7.self_attn.q_proj' is not a linear layer"),
            ("corrupt", adapters["corrupt"], "cannot read adapter_model.safetensors"),
        ]:
            refused = _load(http, name, path)
            assert refused.status_code == 400 and words in refused.json()["error"]["message"], (name, refused.text)
        assert {card.id for card in client.models.list().data} == {MODEL_NAME, "sql"}
        # Sampled at the default temperature: without ignore_eos the adapter may draw EOS first.
        sampled = client.completions.create(model="sql", prompt="SELECT", max_tokens=2, extra_body={"ignore_eos": True})
        assert sampled.usage.completion_tokens == 2

        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 200
        assert {card.id for card in client.models.list().data} == {MODEL_NAME}
        with pytest.raises(openai.NotFoundError, match="'sql' does not exist"):
            client.completions.create(model="sql", prompt="SELECT", max_tokens=2)
        gone = http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
        assert gone.status_code == 404 and "no adapter 'sql'" in gone.json()["error"]["message"]
        assert _load(http, "sql", adapters["chat"]).status_code == 200  # the name is free again
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 200


def test_unloading_lets_running_requests_finish_then_frees_the_adapter(thread_server, thread_llm, adapters) -> None:
    """Its running request finishes in full, new ones get 404, and the engine drops it after the last;
    meanwhile ``/metrics`` shows it running and counts its requests."""
    client = _client(thread_server)
    manager = thread_llm.engine.lora
    with httpx.Client(base_url=thread_server.url, timeout=60) as http:
        assert _load(http, "chat", adapters["chat"]).status_code == 200
        chat_id = thread_server.app.state.server.adapters["chat"].lora_int_id
        stream = client.completions.create(
            model="chat", prompt=PROMPT, max_tokens=600, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = iter(stream)
        next(chunks)
        running = scrape(http)
        info = 'kvserve:lora_requests_info{max_lora="2",running_lora_adapters="chat",waiting_lora_adapters=""}'
        assert info in running and running['kvserve:lora_requests_total{lora_name="chat"}'] == 1
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "chat"}).status_code == 200
        assert chat_id in manager.cache, "freed while a request still runs with it"
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="chat", prompt=PROMPT, max_tokens=2)
        rest = list(chunks)
        assert rest[-1].usage.completion_tokens == 600
        assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "length"
        assert chat_id not in manager.cache and chat_id not in manager.slots
        after = scrape(http)
        assert 'kvserve:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""}' in after


def test_a_resolver_finds_an_unknown_model(thread_server, adapters) -> None:
    """The filesystem resolver serves ``<lora_resolver_cache_dir>/found`` as the model ``found``; names it
    does not hold, or that reach outside its folder, stay 404s."""
    client = _client(thread_server)
    # Sampled at the default temperature: without ignore_eos the adapter may draw EOS first.
    answer = client.completions.create(model="found", prompt=PROMPT, max_tokens=2, extra_body={"ignore_eos": True})
    assert answer.model == "found" and answer.usage.completion_tokens == 2
    cards = {card.id: card.model_dump() for card in client.models.list().data}
    assert cards["found"]["root"] == str(adapters["resolvable"] / "found")
    for name in ["missing", "../chat", str(adapters["chat"])]:
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            client.completions.create(model=name, prompt=PROMPT, max_tokens=2)


def test_an_adapter_tokenizer_encodes_and_decodes_its_requests(thread_server, base, adapters) -> None:
    """The adapter's added token is one token in its prompts (``/tokenize`` and completions) and decodes
    to its text, in the engine's output text and the server's logprobs."""
    client = _client(thread_server)
    tokenizer = AutoTokenizer.from_pretrained(adapters["tok"])
    added = tokenizer.convert_tokens_to_ids(ADDED_TOKEN)
    assert added >= len(AutoTokenizer.from_pretrained(base))
    with httpx.Client(base_url=thread_server.url, timeout=60) as http:
        assert _load(http, "tok", adapters["tok"]).status_code == 200
        tokens = http.post("/tokenize", json={"model": "tok", "prompt": ADDED_TOKEN}).json()["tokens"]
        assert tokens == tokenizer.encode(ADDED_TOKEN) and added in tokens
        assert added not in http.post("/tokenize", json={"prompt": ADDED_TOKEN}).json()["tokens"]
    answer = client.completions.create(
        model="tok", prompt=ADDED_TOKEN, max_tokens=1, temperature=0, logprobs=0, logit_bias={str(added): 100}
    )
    assert answer.usage.prompt_tokens == len(tokenizer.encode(ADDED_TOKEN))
    assert answer.choices[0].text == ADDED_TOKEN and answer.choices[0].logprobs.tokens == [ADDED_TOKEN]


def test_the_routes_are_404s_unless_runtime_updating_is_on(thread_llm, adapters) -> None:
    with start_server(thread_llm) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        assert _load(http, "sql", adapters["sql"]).status_code == 404
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "sql"}).status_code == 404
        with pytest.raises(openai.NotFoundError):
            _client(server).completions.create(model="found", prompt=PROMPT, max_tokens=2)


def test_the_settings_come_from_the_environment_and_need_enable_lora(base) -> None:
    environ = {"KVSERVE_ALLOW_RUNTIME_LORA_UPDATING": "1", "KVSERVE_LORA_RESOLVER_CACHE_DIR": "/adapters"}
    config = load_config(overrides={"model": str(base), "enable_lora": True}, environ=environ)
    assert config.server.allow_runtime_lora_updating and config.server.lora_resolver_cache_dir == "/adapters"
    with pytest.raises(ConfigError, match="allow_runtime_lora_updating needs enable_lora"):
        load_config(overrides={"model": str(base)}, environ=environ)
