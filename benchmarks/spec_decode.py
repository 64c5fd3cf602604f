"""Speculative decoding on vs off, side by side: output tokens/s and the drafts' acceptance.

Two workloads on a model (default: the embedded SmolLM2), each at every ``--batch`` size:

- ``copy``: copy-heavy chat requests — rewrite a given code file with one change, or answer by quoting
  a passage — whose answers repeat long stretches of the prompt (what ``ngram`` prompt lookup finds);
- ``chat``: plain chat questions, whose answers repeat little.

At batch 1 every task of a workload runs alone in turn (one stream); at a larger batch the tasks,
repeated to fill it, run together.

Each ``--speculative-config`` (a preset, ``ngram`` or ``suffix``; ``draft:N``, a ``draft_model`` made of
the model's own first N layers, where no smaller model shares its tokenizer; or JSON) against
speculation off.
Greedy decoding, so every run emits the same tokens in float32; in bfloat16 a row computed in a step of
another shape may round differently, and the outputs that differ are counted. One engine
per setting, warmed up on one request first; ``--rounds`` alternating timed runs, the median reported.

    python benchmarks/spec_decode.py [MODEL] [--batch 1 32] [--dtype bfloat16] [--max-tokens 256]
        [--speculative-config ngram suffix draft:8 '{"method": "ngram", "num_speculative_tokens": 4}']
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from kvserve import LLM, SamplingParams
from kvserve.testing.hf_models import embedded_hf_directory, layer_skip_draft

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
# No global cache: the rounds repeat the same requests, which a cache of earlier outputs would answer from memory.
SUFFIX = {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_cached_requests": 0}
PRESETS = {"ngram": NGRAM, "suffix": SUFFIX}

# A package's __init__.py holds a line or two: nothing to copy.
SOURCE_FILES = sorted(
    path
    for path in (Path(__file__).resolve().parents[1] / "core/src/kvserve/spec_decode").glob("*.py")
    if path.name != "__init__.py"
)
PASSAGE = (
    "The paged KV cache keeps each sequence's keys and values in fixed-size blocks. A block table maps a "
    "sequence's logical blocks to physical ones, so sequences grow without copying and share blocks of a "
    "common prefix. When blocks run out, the scheduler preempts a running request: its blocks are freed and "
    "it is computed again later from its prompt and the tokens it has generated so far."
)
COPY_TASKS = [
    *(f"Rewrite this Python file, renaming every variable called `request` to `req`. Output only the code.\n\n"
      f"```python\n{path.read_text()[:1800]}\n```" for path in SOURCE_FILES),
    f"Here is a passage:\n\n{PASSAGE}\n\nQuote, word for word, the sentence about preemption, then the one "
    "about the block table.",
    f"Repeat this passage exactly, then say how many sentences it has:\n\n{PASSAGE}",
]  # fmt: skip
CHAT_TASKS = [
    "What is the capital of France? Answer in one sentence, then tell me one fact about it.",
    "Write a short poem about the sea.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me three ideas for a weekend trip.",
    "What is a linked list?",
    "How do I boil an egg?",
]


def prompts(tasks: list[str], batch: int) -> list[list[dict[str, str]]]:
    """Every task at least once, repeated up to ``batch``."""
    return [[{"role": "user", "content": tasks[i % len(tasks)]}] for i in range(max(batch, len(tasks)))]


def run(llm: LLM, conversations, params: SamplingParams, batch: int) -> tuple[float, list[list[int]]]:
    """Seconds to answer ``conversations`` ``batch`` at a time, and the answers' token ids."""
    start = time.perf_counter()
    outputs = []
    for first in range(0, len(conversations), batch):
        outputs += llm.chat(conversations[first : first + batch], params, use_tqdm=False)
    return time.perf_counter() - start, [list(o.outputs[0].token_ids) for o in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", nargs="?", help="HF model directory (default: the embedded SmolLM2)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speculative-config", nargs="+", default=sorted(PRESETS), help="presets or JSON")
    parser.add_argument("--workload", nargs="+", default=["copy", "chat"], choices=["copy", "chat"])
    args = parser.parse_args()

    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    fields = {"max_model_len": 2048, "dtype": args.dtype, "max_num_seqs": max(args.batch)}
    configs = {}  # a preset by its name, a JSON config by its method (and its place, if that repeats)
    drafts = Path(tempfile.mkdtemp(prefix="kvserve-layer-skip-"))
    for i, text in enumerate(args.speculative_config):
        if text in PRESETS:
            configs[text] = PRESETS[text]
            continue
        if text.startswith("draft:"):
            layers = int(text.removeprefix("draft:"))
            target = Path(args.model) if args.model else embedded_hf_directory()
            draft = layer_skip_draft(target, drafts / str(layers), layers)
            configs[text] = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 4}
            continue
        config = json.loads(text)
        configs[config["method"] if config["method"] not in configs else f"#{i}"] = config
    engines = {"off": LLM(args.model, **fields)}
    for name, config in configs.items():
        engines[name] = LLM(args.model, **fields, speculative_config=config)
    for llm in engines.values():
        run(llm, prompts(CHAT_TASKS, 1)[:1], SamplingParams(temperature=0, max_tokens=8), 1)  # warm-up
    for name, config in configs.items():
        print(f"{name}: speculative_config={json.dumps(config)}")
    print(f"dtype={args.dtype} max_tokens={args.max_tokens}")
    header = ("workload", "batch", "method", "off tok/s", "on tok/s", "speed-up", "accepted", "mean len")
    print("{:<8} {:>5} {:<8} {:>10} {:>10} {:>8} {:>9} {:>8}".format(*header))
    for workload in args.workload:
        tasks = COPY_TASKS if workload == "copy" else CHAT_TASKS
        for batch in args.batch:
            conversations = prompts(tasks, batch)
            seconds: dict[str, list[float]] = {name: [] for name in engines}
            tokens: dict[str, list[list[int]]] = {}
            before = {name: engines[name].engine.speculator.stats.copy() for name in configs}
            for _ in range(args.rounds):
                for name, llm in engines.items():
                    elapsed, tokens[name] = run(llm, conversations, params, batch)
                    seconds[name].append(elapsed)
            rate = {name: sum(map(len, tokens[name])) / statistics.median(seconds[name]) for name in engines}
            for name in configs:
                # fp32 greedy outputs are identical (the tests hold that); in bf16 a row computed in a step
                # of another shape may round differently and, at a near tie, pick another token.
                same = sum(a == b for a, b in zip(tokens[name], tokens["off"]))
                if same < len(conversations):
                    print(
                        f"{workload} at batch {batch}: {len(conversations) - same} of {len(conversations)} "
                        f"outputs with {name} differ (bf16)"
                    )
                stats = engines[name].engine.speculator.stats
                drafted = stats.num_draft_tokens - before[name].num_draft_tokens
                accepted = stats.num_accepted_tokens - before[name].num_accepted_tokens
                drafts = stats.num_drafts - before[name].num_drafts
                print(
                    f"{workload:<8} {batch:>5} {name:<8} {rate['off']:>10.1f} {rate[name]:>10.1f} "
                    f"{rate[name] / rate['off']:>7.2f}x {accepted / max(drafted, 1):>8.1%} "
                    f"{1 + accepted / max(drafts, 1):>8.2f}"
                )


if __name__ == "__main__":
    main()
