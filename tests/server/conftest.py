"""A real server for the server tests: uvicorn on a free loopback port over a tiny random Llama."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from kvserve.config import EngineConfig, ServerConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.server import ServerThread, build_app
from kvserve.testing.engine_faults import FailingSeed
from kvserve.testing.hf_models import build_tiny_model

MODEL_NAME = "tiny"
# The tiny tokenizer has no chat template of its own.
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m.role }}: {{ m.content }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A context long enough that a request outlives any stall of the test's own threads.
    path = build_tiny_model("llama", tmp_path_factory.mktemp("tiny-chat-llama"), max_position_embeddings=1024)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llm(tiny_model_dir: Path) -> Iterator[AsyncLLM]:
    llm = AsyncLLM.from_config(EngineConfig.from_flat(model=str(tiny_model_dir), dtype="float32", max_num_seqs=128))
    yield llm
    llm.shutdown()


@pytest.fixture(scope="session")
def process_llm(tiny_model_dir: Path) -> Iterator[AsyncLLM]:
    """``tiny_llm``'s engine in its own process; a request of seed 666 fails in its sampler."""
    config = EngineConfig.from_flat(model=str(tiny_model_dir), dtype="float32", max_num_seqs=128, engine_process=True)
    llm = AsyncLLM.from_config(config, core_setup=FailingSeed(666))
    yield llm
    llm.shutdown()
    assert llm.client.process.exitcode == 0, "the engine core process should have stopped cleanly"


def start_server(llm: AsyncLLM, **server_fields: Any) -> ServerThread:
    """A server over ``llm`` with these ServerConfig fields; use as a context manager."""
    return ServerThread(build_app(llm, ServerConfig(port=0, **server_fields), MODEL_NAME))


@pytest.fixture(scope="session")
def make_server() -> Callable[..., ServerThread]:
    """``with make_server(llm, api_key="k") as server:``: another server, with its own settings."""
    return start_server


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    """The server over ``tiny_llm``; a test that must also hold with the engine core in its own process
    runs over both with ``@pytest.mark.parametrize("server", ["thread", "process"], indirect=True)``."""
    mode = getattr(request, "param", "thread")
    with start_server(request.getfixturevalue("process_llm" if mode == "process" else "tiny_llm")) as running:
        yield running


@pytest.fixture
def served_llm(server: ServerThread) -> AsyncLLM:
    """The engine behind ``server``."""
    return server.app.state.server.llm


@pytest.fixture
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as session:
        yield session


@pytest.fixture(scope="session")
def metrics() -> Callable[[httpx.Client], dict[str, float]]:
    return scrape


@pytest.fixture(scope="session")
def idle() -> Callable[..., dict[str, float]]:
    return wait_until_idle


def scrape(http: httpx.Client) -> dict[str, float]:
    """``/metrics`` as ``{sample name with labels: value}``."""
    samples = {}
    for line in http.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def wait_until_idle(http: httpx.Client, timeout: float = 10.0) -> dict[str, float]:
    """Poll ``/metrics`` until no request runs or waits and every KV block is free; returns the last scrape."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = scrape(http)
        idle = metrics["kvserve:num_requests_running"] == 0 and metrics["kvserve:num_requests_waiting"] == 0
        if idle and metrics["kvserve:kv_cache_free_blocks"] == metrics["kvserve:kv_cache_total_blocks"]:
            return metrics
        if time.monotonic() > deadline:
            raise AssertionError(f"engine not idle after {timeout}s: {metrics}")
        time.sleep(0.02)
