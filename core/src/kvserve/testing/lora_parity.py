"""Multi-LoRA against ``peft``'s own ``PeftModel``: every adapter and the base model, each on every
prompt, in one batch of kvserve, row by row against HF ``generate``.

Rows are keyed ``(adapter name or None, prompt index)`` and hold the greedy tokens with their
logprobs. Both sides generate exactly ``new_tokens``: ``min_tokens`` masks EOS as the reference's
``min_new_tokens`` does (a random adapter may favour it).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

Rows = dict[tuple[str | None, int], tuple[list[int], list[float]]]
"""(adapter name or None for the base model, prompt index) -> (greedy tokens, their logprobs)."""


def generate_mixed(llm: Any, prompt_ids: list[list[int]], adapters: Mapping[str, Path], new_tokens: int) -> Rows:
    """Every (adapter or base, prompt) row run by ``llm`` (``enable_lora``) in one ``generate`` call;
    adapter ``i`` of ``adapters`` gets ``lora_int_id`` ``i + 1``."""
    from kvserve import SamplingParams
    from kvserve.lora import LoRARequest

    requests = {name: LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(adapters.items())}
    jobs = [(name, i) for i in range(len(prompt_ids)) for name in [None, *adapters]]
    outputs = llm.generate(
        [prompt_ids[i] for _, i in jobs],
        SamplingParams(temperature=0, max_tokens=new_tokens, min_tokens=new_tokens, logprobs=0),
        use_tqdm=False,
        lora_request=[None if name is None else requests[name] for name, _ in jobs],
    )
    rows = {}
    for job, output in zip(jobs, outputs, strict=True):
        got = output.outputs[0]
        rows[job] = (list(got.token_ids), [entry[t].logprob for entry, t in zip(got.logprobs, got.token_ids)])
    return rows


def peft_rows(base: Path, prompt_ids: list[list[int]], adapters: Mapping[str, Path], new_tokens: int) -> Rows:
    """The same rows from HF ``generate`` in float32 over ``base``, under ``PeftModel`` for an adapter's."""
    from kvserve.testing.hf_models import hf_greedy

    rows = {}
    for name in [None, *adapters]:
        for i, row in enumerate(hf_greedy(base, prompt_ids, new_tokens, adapters.get(name))):
            rows[name, i] = row
    return rows


def assert_rows_match(got: Rows, expected: Rows, logprob_bound: float = 1e-3, against: str = "PeftModel") -> None:
    """Every row's tokens identical to ``expected``'s and its logprobs within ``logprob_bound``; and
    every adapter changes some row of the reference, so the comparison is of something."""
    assert got.keys() == expected.keys(), f"rows {sorted(got, key=str)} != {sorted(expected, key=str)}"
    for (name, i), (tokens, logprobs) in got.items():
        want_tokens, want_logprobs = expected[name, i]
        assert tokens == want_tokens, f"adapter {name}, prompt {i}: {tokens} != {against}'s {want_tokens}"
        worst = max((abs(a - b) for a, b in zip(logprobs, want_logprobs, strict=True)), default=0.0)
        assert worst <= logprob_bound, f"adapter {name}, prompt {i}: a logprob differs from {against}'s by {worst:.3g}"
    adapters = {name for name, _ in expected if name is not None}
    prompts = {i for _, i in expected}
    for name in adapters:
        assert any(expected[name, i][0] != expected[None, i][0] for i in prompts), f"adapter {name} changes nothing"
