"""Issue 14: the engine core in its own process gives the in-process engine's outputs, refuses what
it cannot carry, reports a failed start, and never outlives its frontend."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvserve.config import EngineConfig
from kvserve.errors import ConfigError
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.frontend.output_stream import merge_delta
from kvserve.sampling_params import SamplingParams

REQUESTS = [  # every path of the output processor: stop strings, n > 1, logprobs, deltas, echo of the prompt
    SamplingParams(temperature=0, max_tokens=24, stop=["e", "ab"], logprobs=2),
    SamplingParams(temperature=0, max_tokens=24, stop=["o"], include_stop_str_in_output=True, output_kind="delta"),
    SamplingParams(temperature=1.0, seed=7, n=3, max_tokens=16, logprobs=1, prompt_logprobs=2),
    SamplingParams(temperature=0.8, seed=3, top_k=20, max_tokens=20, output_kind="final_only", stop_token_ids=[5]),
    SamplingParams(temperature=0, max_tokens=16, detokenize=False, ignore_eos=True),
]


async def _collect(llm: AsyncLLM) -> tuple[list, list[float]]:
    """Every output of REQUESTS as it streamed: exact fields (with each logprob's token and rank), and the
    logprob values apart (batches form by timing, and fp32 sums differ in the last bits between them)."""
    values: list[float] = []

    def ranks(positions: list | None) -> list | None:
        if positions is None:
            return None
        values.extend(p.logprob for position in positions if position for p in position.values())
        return [position and {t: p.rank for t, p in position.items()} for position in positions]

    async def one(i: int, params: SamplingParams) -> list:
        # Outputs the consumer has not taken yet are merged (deltas) or superseded, as timing has it:
        # compare what the stream adds up to.
        whole = None
        async for output in llm.generate(f"Prompt {i}: the quick brown fox", params, f"same-{i}"):
            if whole is not None and params.output_kind == "delta":
                merge_delta(whole, output)
            else:
                whole = output
        return [(c.index, c.text, c.token_ids, ranks(c.logprobs), c.finish_reason, c.stop_reason)
                for c in whole.outputs] + [ranks(whole.prompt_logprobs), whole.finished]  # fmt: skip

    streams = [await one(i, p) for i, p in enumerate(REQUESTS)]  # one after another: in order, so are the values
    return streams, values


def test_the_engine_process_streams_what_the_engine_thread_does(tiny_llm: AsyncLLM, process_llm: AsyncLLM) -> None:
    (in_thread, thread_values), (in_process, process_values) = (
        asyncio.run(_collect(llm)) for llm in (tiny_llm, process_llm)
    )
    print(f"{len(in_process)} requests, {len(process_values)} logprobs compared")
    assert in_process == in_thread
    assert process_values == pytest.approx(thread_values, abs=1e-5)
    stats = process_llm.stats()  # came with the last step: all finished, every block free
    assert stats.num_running == stats.num_waiting == 0 and stats.kv_cache.num_free_blocks == stats.kv_cache.num_blocks


def test_a_request_that_cannot_be_pickled_is_refused_naming_the_field(process_llm: AsyncLLM) -> None:
    params = SamplingParams(max_tokens=2, logits_processors=[lambda token_ids, logits: logits])

    async def main() -> None:
        async for _ in process_llm.generate("x", params, "unpicklable"):
            pass

    with pytest.raises(ValueError, match="logits_processors"):
        asyncio.run(main())
    assert process_llm.dead_error is None


def test_a_core_that_cannot_load_raises_the_engines_error(tiny_model_dir: Path) -> None:
    config = EngineConfig.from_flat(model=str(tiny_model_dir), max_model_len=1024, num_kv_blocks=2, engine_process=True)
    with pytest.raises(ConfigError, match="num_kv_blocks"):
        AsyncLLM.from_config(config)


FRONTEND = textwrap.dedent("""
    import sys, time
    from kvserve.config import EngineConfig
    from kvserve.frontend.async_llm import AsyncLLM

    if __name__ == "__main__":
        llm = AsyncLLM.from_config(EngineConfig.from_flat(model=sys.argv[1], engine_process=True))
        print(llm.client.process.pid, flush=True)
        time.sleep(600)
""")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process states from /proc")
def test_a_killed_frontend_leaves_no_engine_core_behind(tiny_model_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "frontend.py"
    script.write_text(FRONTEND)
    frontend = subprocess.Popen([sys.executable, str(script), str(tiny_model_dir)], stdout=subprocess.PIPE, text=True)
    try:
        core = int(frontend.stdout.readline())
        assert _alive(core)
    finally:
        os.kill(frontend.pid, signal.SIGKILL)  # no atexit, no shutdown: only the core's own watch can act
        frontend.wait()
    killed = time.monotonic()
    while _alive(core):
        assert time.monotonic() - killed < 10, f"the engine core (pid {core}) outlived its frontend by 10 s"
        time.sleep(0.05)
    print(f"the engine core exited {time.monotonic() - killed:.2f}s after its frontend was killed")
