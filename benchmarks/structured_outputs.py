"""Structured outputs' cost: decoding under a JSON schema against the same engine unconstrained, and
grammar compile times, for each installed backend.

One engine per backend (the embedded SmolLM2 by default); ``--repeat`` alternating rounds, each
timing one pass unconstrained and one with the schema on every request: ``--batch`` chat prompts
asking for a shopping list, sampled at ``temperature=0.8``, ``max_tokens`` tokens each. The schema
asks for at least 20 items, so every constrained request runs its ``max_tokens`` (it cannot finish
earlier) and the batch stays full, as the unconstrained one does (``ignore_eos``). Compile times:
``cold`` is the backend's ``compile`` of the schema (tokenizer set-up excluded, reported apart);
``cached`` is what a request whose grammar is in the cache waits before it can be scheduled (the
submit, the ready check and a fresh matcher), on the engine's own compiler.

    python benchmarks/structured_outputs.py [--model DIR] [--backend xgrammar --backend guidance]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kvserve import LLM, SamplingParams
from kvserve.plugins import get_plugin_manager, load_component
from kvserve.request import Request
from kvserve.sampling_params import StructuredOutputsParams
from kvserve_cpu_native import cpu_name_and_flags

SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 20,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "quantity": {"type": "integer"}},
                "required": ["name", "quantity"],
            },
        }
    },
    "required": ["items"],
}
PROMPT = "Write a shopping list for a week of family dinners as JSON."


def decode_rates(llm: LLM, prompts: list[str], max_tokens: int, repeat: int) -> dict[str, list[float]]:
    """Generated tokens/s of each round, unconstrained and under the schema."""
    modes = {
        "unconstrained": {"ignore_eos": True},
        "json schema": {"structured_outputs": StructuredOutputsParams(json=SCHEMA)},
    }
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_ in range(repeat):
        for mode, fields in modes.items():
            params = [
                SamplingParams(temperature=0.8, seed=i, max_tokens=max_tokens, **fields) for i in range(len(prompts))
            ]
            llm.reset_prefix_cache()
            start = time.perf_counter()
            outputs = llm.generate(prompts, params, use_tqdm=False)
            seconds = time.perf_counter() - start
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            rates[mode].append(tokens / seconds)
            print(f"round {round_} {mode:<14} {tokens / seconds:8.1f} tok/s ({tokens} tokens)", flush=True)
    return rates


def compile_times(llm: LLM, backend: str, repeat: int) -> dict[str, float]:
    """Milliseconds: tokenizer set-up, cold compile of the schema (median), and a cached request's wait."""
    engine = llm.engine
    params = StructuredOutputsParams(json=SCHEMA)
    cls = load_component("structured_output_backend", backend)
    start = time.perf_counter()
    config = engine.config.decoding.structured_outputs_config
    instance = cls(engine.tokenizer, engine.hf_config.vocab_size, engine.eos_token_ids, config)
    setup = time.perf_counter() - start
    cold = []
    for i in range(repeat):  # a new description each time: a backend's own cache cannot answer
        fresh = StructuredOutputsParams(json={**SCHEMA, "description": f"cold compile {i}"})
        start = time.perf_counter()
        instance.compile(fresh)
        cold.append(time.perf_counter() - start)
    grammars = engine.grammars
    sampling = SamplingParams(structured_outputs=params)
    warm = Request("warm", [1], sampling)
    grammars.submit(warm, backend)
    while warm.logits_constraint is None:
        grammars.install_ready()
    cached = []
    for i in range(repeat * 10):
        request = Request(f"cached-{i}", [1], sampling)
        start = time.perf_counter()
        grammars.submit(request, backend)
        grammars.install_ready()
        ready = request.is_ready()
        cached.append(time.perf_counter() - start)
        assert ready, "a cached grammar was not ready at once"
    return {"tokenizer_setup_ms": setup * 1e3, "cold_compile_ms": statistics.median(cold) * 1e3,
            "cached_request_ms": statistics.median(cached) * 1e3}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF directory or .gguf (default: the embedded SmolLM2)")
    parser.add_argument("--backend", action="append", help="repeatable (default: every installed backend)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()

    registry = get_plugin_manager().registry("structured_output_backend")
    backends = args.backend or [r.name for r in registry.entries() if not r.facts.get("unavailable")]
    results = {}
    for backend in backends:
        llm = LLM(args.model, dtype=args.dtype, max_num_seqs=args.batch, structured_outputs_config={"backend": backend})
        prompt = llm.engine.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                                          add_generation_prompt=True)  # fmt: skip
        prompts = [prompt] * args.batch
        llm.generate(prompts[:2], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
        print(f"== {backend}", flush=True)
        rates = decode_rates(llm, prompts, args.max_tokens, args.repeat)
        medians = {mode: statistics.median(values) for mode, values in rates.items()}
        results[backend] = {
            "tokens_per_s": medians,
            "ratio": medians["json schema"] / medians["unconstrained"],
            **compile_times(llm, backend, args.repeat),
        }
        llm.engine.shutdown()
    cpu, flags = cpu_name_and_flags()
    isa = " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "?"
    print(f"\nbatch {args.batch} x {args.max_tokens} tokens, {args.dtype}, {torch.get_num_threads()} threads, "
          f"{cpu} ({isa})")  # fmt: skip
    print(f"{'backend':<10} {'unconstr. tok/s':>15} {'schema tok/s':>12} {'ratio':>6} {'setup ms':>9} "
          f"{'cold ms':>8} {'cached ms':>9}")  # fmt: skip
    for backend, r in results.items():
        t = r["tokens_per_s"]
        print(f"{backend:<10} {t['unconstrained']:15.1f} {t['json schema']:12.1f} {r['ratio']:6.3f} "
              f"{r['tokenizer_setup_ms']:9.1f} {r['cold_compile_ms']:8.1f} {r['cached_request_ms']:9.3f}")  # fmt: skip
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
