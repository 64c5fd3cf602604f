"""A prompt is checked once, by its front end (``LLM``, ``AsyncLLM``, the server), however many
samples it asks for; the engine takes the checked request as it is. Counted through a batch-level
logits processor, whose ``validate_params`` ``check_request`` calls once per check, on the
caller's thread (the engine's own thread, under ``AsyncLLM``, checks nothing)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from kvserve import LLM, SamplingParams
from kvserve.config import EngineConfig, ServerConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.interfaces import BatchUpdate, LogitsProcessor
from kvserve.server.state import ServerState
from kvserve.testing.hf_models import build_tiny_model

PROMPT = "Paged attention stores keys and values in fixed size blocks"


class CountingProcessor(LogitsProcessor):
    """Leaves the logits alone; records the thread of every check."""

    validated: list[str] = []

    def __init__(self, config: EngineConfig, device: torch.device, is_pin_memory: bool) -> None:
        pass

    @classmethod
    def validate_params(cls, params: SamplingParams) -> None:
        """Count the check (refusing a marked request, to show where checks happen)."""
        cls.validated.append(threading.current_thread().name)
        if (params.extra_args or {}).get("refuse"):
            raise ValueError("extra_args.refuse: refused by CountingProcessor")

    def is_argmax_invariant(self) -> bool:
        """It changes nothing."""
        return True

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Nothing to track."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits unchanged."""
        return logits


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = build_tiny_model("llama", tmp_path_factory.mktemp("validate_once"))
    return LLM(str(path), dtype="float32", max_model_len=64, num_kv_blocks=32, logits_processors=[CountingProcessor])


PARAMS = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=3, ignore_eos=True, bad_words=["cat"])


def test_offline_generate_checks_each_prompt_once(llm):
    CountingProcessor.validated.clear()
    outputs = llm.generate([PROMPT, PROMPT + " again"], PARAMS, use_tqdm=False)
    assert [[len(c.token_ids) for c in out.outputs] for out in outputs] == [[3, 3, 3]] * 2
    assert len(CountingProcessor.validated) == 2
    with pytest.raises(ValueError, match="extra_args.refuse"):
        llm.generate(PROMPT, PARAMS.model_copy(update={"extra_args": {"refuse": True}}), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_async_generate_and_the_server_check_each_prompt_once(llm):
    async_llm = AsyncLLM(llm.engine)  # the engine steps on the core's thread from now on
    state = ServerState(async_llm, ServerConfig())
    ids = llm.get_tokenizer().encode(PROMPT)
    delta = PARAMS.model_copy(update={"output_kind": "delta"})

    async def run():
        direct = [out async for out in async_llm.generate(PROMPT, PARAMS, "direct")]
        served = [item async for item in state.generate(state.validate([ids, ids[1:]], delta, priority=0))]
        return direct, served

    try:
        CountingProcessor.validated.clear()
        direct, served = asyncio.run(run())
        assert direct[-1].finished and [len(c.token_ids) for c in direct[-1].outputs] == [3, 3, 3]
        tokens = {(prompt, c.index): 0 for prompt in (0, 1) for c in direct[-1].outputs}
        for prompt, output in served:
            for completion in output.outputs:
                tokens[prompt, completion.index] += len(completion.token_ids)
        assert tokens == dict.fromkeys(tokens, 3)
        assert len(CountingProcessor.validated) == 1 + 2, "AsyncLLM.generate checks once, the server once a prompt"
        assert "kvserve-engine" not in CountingProcessor.validated, "the engine's thread checks nothing"
        refused = PARAMS.model_copy(update={"extra_args": {"refuse": True}})
        with pytest.raises(ValueError, match="extra_args.refuse"):
            asyncio.run(anext(async_llm.generate(PROMPT, refused, "refused")))
    finally:
        async_llm.shutdown()
