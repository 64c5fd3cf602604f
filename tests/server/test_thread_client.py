"""ThreadClient builds the engine on the thread that steps it (one OpenMP pool for the model's
kernels), passes a failed build to its caller, and stops cleanly whether or not it was started."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from kvserve.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.frontend.thread_client import ThreadClient
from kvserve.sampling_params import SamplingParams


def test_from_config_builds_and_steps_the_engine_on_one_thread(tiny_model_dir: Path) -> None:
    threads: dict[str, str] = {}

    def record_thread(engine: LLMEngine) -> None:  # core_setup runs right after the build
        threads["build"] = threading.current_thread().name
        step = engine.step

        def recording_step():
            threads["step"] = threading.current_thread().name
            return step()

        engine.step = recording_step

    llm = AsyncLLM.from_config(EngineConfig.from_flat(model=str(tiny_model_dir)), core_setup=record_thread)
    try:

        async def generate() -> list[int]:
            params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
            async for output in llm.generate([1, 2, 3], params, request_id="r"):
                last = output
            return list(last.outputs[0].token_ids)

        assert len(asyncio.run(generate())) == 3
    finally:
        llm.shutdown()
    assert threads == {"build": "kvserve-engine", "step": "kvserve-engine"}


def test_a_failed_build_is_raised_to_the_caller() -> None:
    def build() -> LLMEngine:
        raise ValueError("no such model: nowhere")

    with pytest.raises(ValueError, match="no such model: nowhere"):
        ThreadClient(build)


def test_a_built_core_that_never_started_shuts_down(tiny_model_dir: Path) -> None:
    client = ThreadClient(lambda: LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir))))
    assert client._thread.is_alive()  # built, waiting for start()
    client.shutdown()
    assert not client._thread.is_alive()
