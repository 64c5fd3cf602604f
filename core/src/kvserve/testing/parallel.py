"""Greedy tokens of a checkpoint at a tensor-parallel size, for parity tests of parallel layers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ENGINE = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 64}
"""Engine arguments of the tiny-model parity tests (fp32: tokens must match exactly)."""


def greedy_tokens(path: Path | str, prompt_ids: list[list[int]], new_tokens: int = 16, **engine: Any) -> list[list]:
    """Greedy token ids per prompt from a fresh ``kvserve.LLM(path, **ENGINE, **engine)``
    (``tensor_parallel_size=2`` runs the multiprocess executor), shut down afterwards, its
    worker processes with it."""
    from kvserve import LLM, SamplingParams

    llm = LLM(str(path), **{**ENGINE, **engine})
    try:
        params = SamplingParams(temperature=0, max_tokens=new_tokens)
        return [o.outputs[0].token_ids for o in llm.generate(prompt_ids, params, use_tqdm=False)]
    finally:
        llm.engine.shutdown()
