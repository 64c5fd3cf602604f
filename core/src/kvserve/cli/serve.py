"""``kvserve serve``: the OpenAI-compatible HTTP server, as ``vllm serve`` is for vLLM."""

from __future__ import annotations

from typing import Annotated

import typer

from kvserve.cli.app import app
from kvserve.cli.options import (
    Assignments,
    ConfigFile,
    ExecutorBackend,
    OptimizationLevel,
    TensorParallelSize,
    resolve_config,
)


@app.command()
def serve(
    model: Annotated[
        str | None, typer.Argument(help="HF directory or .gguf file (default: the embedded SmolLM2).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Interface to bind (default: 127.0.0.1, loopback only).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: 8000).")] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Require 'Authorization: Bearer KEY' (prefer env KVSERVE_API_KEY: not in ps).")
    ] = None,
    served_model_name: Annotated[str | None, typer.Option(help="The model name clients send.")] = None,
    max_concurrent_sequences: Annotated[
        int | None, typer.Option(help="Sequences (n x prompts) in flight; more get 429 (default: 256).")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Context length (default: the model's).")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Sequences per batch (default: 128).")] = None,
    dtype: Annotated[str | None, typer.Option(help="auto, float32, bfloat16 or float16.")] = None,
    tensor_parallel_size: TensorParallelSize = None,
    distributed_executor_backend: ExecutorBackend = None,
    optimization_level: OptimizationLevel = None,
    config_file: ConfigFile = None,
    assignments: Assignments = None,
    engine_process: Annotated[
        bool | None,
        typer.Option(
            "--engine-process/--no-engine-process",
            help="Step the engine in its own process behind ZeroMQ (default: off, in a thread of the server).",
        ),
    ] = None,
    chat_template: Annotated[
        str | None, typer.Option(help="A Jinja chat template, or a file holding one, instead of the tokenizer's.")
    ] = None,
    enable_auto_tool_choice: Annotated[
        bool | None,
        typer.Option(
            "--enable-auto-tool-choice",
            help="Let the model decide whether to call tools (tool_choice 'auto'); needs --tool-call-parser.",
        ),
    ] = None,
    tool_call_parser: Annotated[
        str | None, typer.Option(help="The parser of the model's tool calls (`kvserve plugins` lists them).")
    ] = None,
    tool_parser_plugin: Annotated[
        str | None, typer.Option(help="A Python file of ToolParser classes, registered under their names.")
    ] = None,
    structured_outputs_config: Annotated[
        str | None,
        typer.Option(
            help='Structured outputs as JSON, e.g. \'{"backend": "auto", "disable_any_whitespace": true}\' '
            "(backend: auto or a registered structured_output_backend).",
        ),
    ] = None,
    speculative_config: Annotated[
        str | None,
        typer.Option(
            help="Speculative decoding as JSON, vLLM's fields, e.g. "
            '\'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\' (off by default).',
        ),
    ] = None,
    reasoning_parser: Annotated[
        str | None,
        typer.Option(
            help="Split chat answers' reasoning into reasoning_content (`kvserve plugins` lists the parsers)."
        ),
    ] = None,
    generation_config: Annotated[
        str | None,
        typer.Option(
            help="Sampling defaults of requests that leave them unset: auto (the model's generation_config.json), "
            "vllm (none) or a folder holding a generation_config.json (default: auto)."
        ),
    ] = None,
    override_generation_config: Annotated[
        str | None,
        typer.Option(help="Sampling defaults as JSON over generation_config's, e.g. '{\"temperature\": 0.5}'."),
    ] = None,
    enable_lora: Annotated[
        bool | None, typer.Option("--enable-lora", help="Serve LoRA adapters (see --lora-modules).")
    ] = None,
    lora_modules: Annotated[
        list[str] | None,
        typer.Option(
            help="An adapter served under its own model name: name=path, or JSON "
            '\'{"name": ..., "path": ..., "base_model_name": ...}\' (repeat the flag for several).'
        ),
    ] = None,
    max_lora_rank: Annotated[int | None, typer.Option(help="Largest adapter rank accepted (default: 16).")] = None,
    max_loras: Annotated[int | None, typer.Option(help="Adapters running at once (default: 1).")] = None,
    max_cpu_loras: Annotated[
        int | None, typer.Option(help="Idle adapters kept loaded in host memory (default: max_loras).")
    ] = None,
    allow_runtime_lora_updating: Annotated[
        bool | None,
        typer.Option(
            "--allow-runtime-lora-updating",
            help="Serve /v1/load_lora_adapter and /v1/unload_lora_adapter, and find adapters a request names "
            "with the lora_resolver plugins.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "info",
) -> None:
    """Serve a model over the OpenAI API until SIGINT or SIGTERM.

    Endpoints: /v1/completions, /v1/chat/completions, /v1/models, /health, /version, /tokenize,
    /detokenize, /metrics (and /v1/load_lora_adapter, /v1/unload_lora_adapter with
    --allow-runtime-lora-updating). Settings come from --config FILE, KVSERVE_* env vars, --set and options.
    """
    config = resolve_config(
        config_file, assignments, model=model, host=host, port=port, api_key=api_key,
        served_model_name=served_model_name, max_concurrent_sequences=max_concurrent_sequences,
        max_model_len=max_model_len, max_num_seqs=max_num_seqs, dtype=dtype,
        tensor_parallel_size=tensor_parallel_size, distributed_executor_backend=distributed_executor_backend,
        engine_process=engine_process, chat_template=chat_template, enable_auto_tool_choice=enable_auto_tool_choice,
        tool_call_parser=tool_call_parser, tool_parser_plugin=tool_parser_plugin, reasoning_parser=reasoning_parser,
        structured_outputs_config=structured_outputs_config, speculative_config=speculative_config,
        generation_config=generation_config, override_generation_config=override_generation_config,
        optimization_level=optimization_level, enable_lora=enable_lora, lora_modules=lora_modules,
        max_lora_rank=max_lora_rank, max_loras=max_loras, max_cpu_loras=max_cpu_loras,
        allow_runtime_lora_updating=allow_runtime_lora_updating,
    )  # fmt: skip
    from kvserve.server.runner import serve as run_server  # after the config: a bad one fails before the import

    run_server(config, log_level=log_level)
