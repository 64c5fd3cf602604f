"""The embedded SmolLM2 GGUF kept in its GGML blocks (``quantization="gguf"``, kvserve-quant-gguf) against
today's dequantized path (``quantization="none"``: every weight to the model dtype at load), one fresh
process each so neither warms the other's caches:

- start-up: building ``LLM`` on the ``.gguf`` file (parse, load, kernel build if not cached);
- single-stream decode tokens/s: one prompt, ``--tokens`` greedy tokens (ignore_eos), best of ``--repeat``;
- batch tokens/s: ``--batch`` prompts at once, ``--tokens`` each.

Prints each figure, the packed/dequantized ratio, and the CPU's name and the ISA flags that matter
(avx512_vnni, avx512_bf16, amx). The machine's other load is not controlled: run it on a quiet machine.

    python benchmarks/gguf_packed.py --tokens 64 --batch 32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

RUN = """
import json, sys, time
from kvserve import LLM, SamplingParams
from kvserve.loader.default_model import embedded_gguf_path
quantization, tokens, batch, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
start = time.perf_counter()
llm = LLM(str(embedded_gguf_path()), quantization=quantization, max_model_len=512)
startup = time.perf_counter() - start
params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
def rate(prompts):
    best = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        best = max(best, len(prompts) * tokens / (time.perf_counter() - start))
    return best
single = rate(["Write a short story about a lighthouse keeper."])
many = rate([f"Question {i}: name a city in country number {i}." for i in range(batch)])
print(json.dumps({"startup_s": startup, "single_tok_s": single, "batch_tok_s": many}))
"""


def measure(quantization: str, args: argparse.Namespace) -> dict[str, float]:
    """The figures of one fresh process."""
    command = [sys.executable, "-c", RUN, quantization, str(args.tokens), str(args.batch), str(args.repeat)]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=os.environ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    from kvserve_cpu_native import cpu_name_and_flags

    name, flags = cpu_name_and_flags()
    isa = [flag for flag in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "avx2") if flag in flags]
    print(f"CPU: {name}; ISA: {' '.join(isa)}; threads: {os.environ.get('OMP_NUM_THREADS', 'all')}")
    packed, dense = measure("gguf", args), measure("none", args)
    for key, label in [("startup_s", "start-up s"), ("single_tok_s", "single tok/s"), ("batch_tok_s", "batch tok/s")]:
        print(f"{label:>13}: gguf (packed) {packed[key]:8.2f}  none (dequantized) {dense[key]:8.2f}  "
              f"ratio {packed[key] / dense[key]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
