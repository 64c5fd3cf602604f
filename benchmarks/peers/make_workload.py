"""The peers' deterministic workload: 32 prompts of 32 token ids (BOS + 31 random non-special ids), 128 new
tokens each, written as JSON (``num_prompts``, ``prompt_len``, ``max_new_tokens``, ``prompts``).

    python benchmarks/peers/make_workload.py ~/.cache/kvserve-peers/workload.json
"""

import json
import random
import sys

NUM_PROMPTS, PROMPT_LEN, MAX_NEW_TOKENS = 32, 32, 128
VOCAB = 32000  # make_models.py's tokenizer; ids 0-3 are its special tokens


def main(path: str) -> None:
    rng = random.Random(1234)
    prompts = [[0] + [rng.randrange(4, VOCAB) for _ in range(PROMPT_LEN - 1)] for _ in range(NUM_PROMPTS)]
    workload = {"num_prompts": NUM_PROMPTS, "prompt_len": PROMPT_LEN, "max_new_tokens": MAX_NEW_TOKENS}
    with open(path, "w") as out:
        json.dump({**workload, "prompts": prompts}, out)


if __name__ == "__main__":
    main(sys.argv[1])
