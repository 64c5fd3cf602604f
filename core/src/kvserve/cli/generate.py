"""``kvserve generate``: offline generation from the command line."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from kvserve.cli.app import app
from kvserve.cli.options import (
    Assignments,
    ConfigFile,
    ExecutorBackend,
    ModelOption,
    OptimizationLevel,
    TensorParallelSize,
    resolve_fields,
)


@app.command()
def generate(
    prompts: Annotated[list[str], typer.Argument(help="Prompts; each is sent through the chat template.")],
    model: ModelOption = None,
    max_tokens: Annotated[int, typer.Option(help="Tokens to generate per prompt.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 for greedy decoding.")] = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    sampling_seed: Annotated[int | None, typer.Option("--seed", help="Per-request sampling seed.")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send prompts as plain text, without the chat template.")] = False,
    dtype: Annotated[str | None, typer.Option(help="auto, float32, bfloat16 or float16.")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Sequences per batch (default: 128).")] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Context length (default: the model's).")] = None,
    tensor_parallel_size: TensorParallelSize = None,
    distributed_executor_backend: ExecutorBackend = None,
    optimization_level: OptimizationLevel = None,
    config_file: ConfigFile = None,
    assignments: Assignments = None,
) -> None:
    """Generate completions offline and print them."""
    from kvserve.entrypoints.llm import LLM
    from kvserve.sampling_params import SamplingParams

    llm = LLM(
        **resolve_fields(
            config_file, assignments, model=model, dtype=dtype, max_num_seqs=max_num_seqs,
            max_model_len=max_model_len, tensor_parallel_size=tensor_parallel_size,
            distributed_executor_backend=distributed_executor_backend, optimization_level=optimization_level,
        )
    )  # fmt: skip
    params = SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=sampling_seed
    )
    if raw:
        outputs = llm.generate(prompts, params)
    else:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params)
    console = Console()
    for prompt, output in zip(prompts, outputs):
        completion = output.outputs[0]
        console.print(f"[bold]>>> {prompt}[/bold]")
        console.print(completion.text.strip(), markup=False, highlight=False)
        if output.error is not None:
            console.print(f"[red]request failed: {output.error}[/red]", highlight=False)
        console.print(f"[dim]({len(completion.token_ids)} tokens, finish_reason={completion.finish_reason})[/dim]\n")
