"""A standard-library-only load client for any OpenAI-compatible server, so every server meets the same client.

Sends every prompt of the workload to ``/v1/completions`` (token-id prompts, greedy, ``ignore_eos``, not
streamed), ``--concurrency`` at a time, after a two-request warm-up; prints one JSON line per repeat with the
generated tokens/s (from ``usage.completion_tokens``) and the mean and longest request latency.

    python benchmarks/peers/bench_openai_client.py --url http://127.0.0.1:8000 --model NAME \\
        --workload ~/.cache/kvserve-peers/workload.json
"""

import argparse
import http.client
import json
import os
import statistics
import threading
import time
import urllib.parse

DEFAULT_WORKLOAD = os.path.join(
    os.environ.get("KVSERVE_PEERS_DIR", os.path.expanduser("~/.cache/kvserve-peers")), "workload.json"
)


def one(url: urllib.parse.ParseResult, model: str, prompt: list[int], max_tokens: int, out: list) -> None:
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
        "min_tokens": max_tokens, "stream": False,
    })  # fmt: skip
    start = time.perf_counter()
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {data[:500]!r}")
    out.append((time.perf_counter() - start, json.loads(data)["usage"]["completion_tokens"]))


def run(url, model: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> tuple[float, list]:
    """Send every prompt, ``concurrency`` at a time: (wall seconds, [(latency, completion tokens)])."""
    out: list = []
    slots = threading.Semaphore(concurrency)

    def send(prompt: list[int]) -> None:
        with slots:
            one(url, model, prompt, max_tokens, out)

    threads = [threading.Thread(target=send, args=(p,)) for p in prompts]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="")
    parser.add_argument("--workload", default=DEFAULT_WORKLOAD)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with open(args.workload) as f:
        workload = json.load(f)
    url = urllib.parse.urlparse(args.url)
    max_tokens = workload["max_new_tokens"]
    run(url, args.model, workload["prompts"][:2], max_tokens, args.concurrency)  # warm-up
    for _ in range(args.repeat):
        wall, out = run(url, args.model, workload["prompts"], max_tokens, args.concurrency)
        tokens = sum(n for _, n in out)
        latencies = [latency for latency, _ in out]
        print(json.dumps({
            "url": args.url, "requests": len(out), "concurrency": args.concurrency,
            "prompt_len": len(workload["prompts"][0]), "max_tokens": max_tokens, "gen_tokens": tokens,
            "seconds": round(wall, 2), "gen_tok_per_s": round(tokens / wall, 1),
            "lat_mean_s": round(statistics.mean(latencies), 2), "lat_max_s": round(max(latencies), 2),
        }))  # fmt: skip


if __name__ == "__main__":
    main()
