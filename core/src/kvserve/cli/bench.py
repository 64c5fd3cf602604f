"""``kvserve bench throughput|latency|serve``: offline engine benchmarks, and load on a running server."""

from __future__ import annotations

import asyncio
import math
import statistics
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kvserve.cli.app import app
from kvserve.cli.options import Assignments, ConfigFile, ModelOption, OptimizationLevel, resolve_fields

bench_app = typer.Typer(help="Benchmark offline throughput and latency, or a running server.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

OutputLen = Annotated[
    int, typer.Option(help="Tokens generated per request (EOS ignored, so every run does the same work).")
]


def _load_llm(fields: dict[str, Any], console: Console) -> Any:
    from kvserve.entrypoints.llm import LLM

    with console.status("Loading the model ..."):
        return LLM(**fields)


@bench_app.command()
def throughput(
    model: ModelOption = None,
    num_prompts: Annotated[int, typer.Option(help="Requests, all submitted at once.")] = 64,
    input_len: Annotated[
        int | None, typer.Option(help="Random prompts of this many tokens (default: chat questions).")
    ] = None,
    output_len: OutputLen = 64,
    optimization_level: OptimizationLevel = None,
    config_file: ConfigFile = None,
    assignments: Assignments = None,
) -> None:
    """Offline throughput: every request submitted to ``LLM.generate`` at once."""
    from kvserve.benchmarking.offline import measure_throughput

    console = Console()
    fields = resolve_fields(config_file, assignments, model=model, optimization_level=optimization_level)
    llm = _load_llm(fields, console)
    prompts = _prompts(llm, num_prompts, input_len)
    measure_throughput(llm, prompts[:2], 4, progress=False)  # warm-up
    result = measure_throughput(llm, prompts, output_len)
    table = Table(title=f"Offline throughput: {num_prompts} requests x {output_len} output tokens")
    for column in ("requests/s", "output tokens/s", "total tokens/s", "seconds"):
        table.add_column(column, justify="right")
    table.add_row(
        f"{result.requests_per_second:.2f}", f"{result.output_tokens_per_second:.1f}",
        f"{result.total_tokens_per_second:.1f}", f"{result.seconds:.2f}",
    )  # fmt: skip
    console.print(table)
    console.print(_how_it_ran(llm), highlight=False)


@bench_app.command()
def latency(
    model: ModelOption = None,
    batch_size: Annotated[int, typer.Option(help="Requests per batch.")] = 8,
    input_len: Annotated[int, typer.Option(help="Prompt tokens per request (random ids).")] = 32,
    output_len: OutputLen = 64,
    num_iters: Annotated[int, typer.Option(help="Measured iterations.")] = 5,
    warmup_iters: Annotated[int, typer.Option(help="Unmeasured iterations first.")] = 1,
    optimization_level: OptimizationLevel = None,
    config_file: ConfigFile = None,
    assignments: Assignments = None,
) -> None:
    """Offline latency: seconds to complete one batch, over several iterations."""
    from kvserve.benchmarking.offline import measure_latency
    from kvserve.benchmarking.percentile import percentile

    console = Console()
    fields = resolve_fields(config_file, assignments, model=model, optimization_level=optimization_level)
    llm = _load_llm(fields, console)
    prompts = _prompts(llm, batch_size, input_len)
    latencies = measure_latency(llm, prompts, output_len, num_iters, warmup_iters)
    table = Table(title=f"Batch latency: {batch_size} x ({input_len} prompt + {output_len} output tokens)")
    table.add_column("statistic")
    table.add_column("seconds", justify="right")
    table.add_row("mean", f"{statistics.fmean(latencies):.3f}")
    for p in (10, 50, 90, 99):
        table.add_row(f"p{p}", f"{percentile(latencies, p):.3f}")
    console.print(table)
    console.print(_how_it_ran(llm), highlight=False)


@bench_app.command("serve")
def serve_benchmark(
    base_url: Annotated[str, typer.Option(help="The server, without /v1.")] = "http://127.0.0.1:8000",
    model: Annotated[str | None, typer.Option(help="Served model name (default: the server's).")] = None,
    num_prompts: Annotated[int, typer.Option(help="Requests to send.")] = 64,
    output_len: OutputLen = 64,
    request_rate: Annotated[
        float, typer.Option(help="Mean requests/s, Poisson arrivals (inf: all at once).")
    ] = math.inf,
    max_concurrency: Annotated[int | None, typer.Option(help="At most this many requests in flight.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="KVSERVE_API_KEY", help="The server's API key.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the arrival times.")] = 0,
) -> None:
    """Drive a running server with streamed completions; report TTFT/TPOT/ITL percentiles and throughput."""
    from kvserve.benchmarking.serving_client import run_serving_benchmark
    from kvserve.benchmarking.workload import questions

    result = asyncio.run(
        run_serving_benchmark(
            base_url, questions(num_prompts), output_len, model=model, request_rate=request_rate,
            max_concurrency=max_concurrency, api_key=api_key, seed=seed,
        )
    )  # fmt: skip
    summary = result.summary()
    console = Console()
    if not result.completed:
        first_error = next((r.error for r in result.results if r.error), "no response")
        console.print(f"[red]error:[/red] no request succeeded: {first_error}")
        raise typer.Exit(1)
    console.print(serving_table(summary, f"Serving benchmark: {num_prompts} requests at rate {request_rate}/s"))


def serving_table(summary: dict[str, float], title: str) -> Table:
    """The ``kvserve bench serve`` report: throughput, then latency statistics in milliseconds."""
    table = Table(title=title)
    table.add_column("metric")
    for column in ("mean", "p50", "p90", "p99"):
        table.add_column(column, justify="right")
    for name, label in (
        ("ttft", "TTFT (ms)"),
        ("tpot", "TPOT (ms)"),
        ("itl", "ITL (ms)"),
        ("e2el", "E2E latency (ms)"),
    ):
        table.add_row(label, *(f"{summary[f'{stat}_{name}_ms']:.1f}" for stat in ("mean", "p50", "p90", "p99")))
    table.caption = (
        f"{summary['completed']} completed, {summary['failed']} failed in {summary['duration_s']:.2f} s; "
        f"{summary['request_throughput']:.2f} req/s, {summary['output_throughput']:.1f} output tok/s, "
        f"{summary['total_token_throughput']:.1f} total tok/s"
    )
    return table


def _how_it_ran(llm: Any) -> str:
    """The engine's optimization level, compilation (with compile seconds) and attention kernels."""
    engine = llm.engine
    return f"dtype={str(engine.dtype).removeprefix('torch.')} {engine.execution_summary()}"


def _prompts(llm: Any, count: int, input_len: int | None) -> list[list[int]]:
    from kvserve.benchmarking.workload import chat_prompt_ids, random_prompt_ids

    if input_len is None:
        return chat_prompt_ids(llm.get_tokenizer(), count)
    return random_prompt_ids(llm.engine.hf_config.vocab_size, count, input_len)
