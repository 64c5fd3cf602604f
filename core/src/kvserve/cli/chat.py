"""``kvserve chat``: an interactive terminal chat with a running server (via the openai client) or in-process."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Annotated

import typer
from rich.console import Console

from kvserve.cli.app import app
from kvserve.cli.options import Assignments, ConfigFile, ModelOption, resolve_config
from kvserve.config import EngineConfig
from kvserve.sampling_params import SamplingParams

Message = dict[str, str]
Replier = Callable[[list[Message]], Iterator[str]]
"""Streams the assistant's reply to a conversation, piece by piece."""

HELP_LINE = "Type a message. /reset starts over, /exit or Ctrl-D quits, Ctrl-C stops a reply."


@app.command()
def chat(
    url: Annotated[str, typer.Option(help="Base URL of a running kvserve (or any OpenAI-compatible) server.")] = (
        "http://127.0.0.1:8000/v1"
    ),
    local: Annotated[bool, typer.Option("--local", help="Run the engine in this process instead of a server.")] = False,
    model: ModelOption = None,
    server_api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="KVSERVE_API_KEY", help="The server's API key.")
    ] = None,
    system: Annotated[str | None, typer.Option(help="A system prompt to start the conversation with.")] = None,
    max_tokens: Annotated[int, typer.Option(help="Most tokens per reply.")] = 512,
    temperature: float = 0.7,
    top_p: float = 1.0,
    sampling_seed: Annotated[int | None, typer.Option("--seed", help="Sampling seed, for repeatable replies.")] = None,
    config_file: ConfigFile = None,
    assignments: Assignments = None,
) -> None:
    """Chat in the terminal with a running server, or with --local an engine in this process.

    With a server, --model is the served model name (default: the server's first); with --local,
    it is the model to load, and --config/--set configure the engine.
    """
    params = SamplingParams(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=sampling_seed, output_kind="delta"
    )
    console = Console()
    if local:
        reply = _local_replier(resolve_config(config_file, assignments, model=model), params, console)
    else:
        reply = _server_replier(url, model, server_api_key, params, console)
    _converse(reply, system, console)


def _converse(reply: Replier, system: str | None, console: Console) -> None:
    start: list[Message] = [{"role": "system", "content": system}] if system else []
    history = list(start)
    console.print(f"[dim]{HELP_LINE}[/dim]")
    while True:
        try:
            line = console.input("[bold green]>>> [/bold green]").strip()
        except (EOFError, KeyboardInterrupt):
            console.print()
            return
        if line in ("/exit", "/quit"):
            return
        if line == "/reset":
            history = list(start)
            continue
        if not line:
            continue
        history.append({"role": "user", "content": line})
        pieces = []
        try:
            for piece in reply(history):
                pieces.append(piece)
                console.print(piece, end="", markup=False, highlight=False, soft_wrap=True)
        except KeyboardInterrupt:
            console.print(" [dim](stopped)[/dim]", end="")
        console.print()
        history.append({"role": "assistant", "content": "".join(pieces)})


def _server_replier(
    url: str, model: str | None, api_key: str | None, params: SamplingParams, console: Console
) -> Replier:
    from kvserve.extras import requires_extra

    with requires_extra("server", "kvserve chat with a server (without --local)"):
        import openai

    client = openai.OpenAI(base_url=url, api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none")
    try:
        model = model or client.models.list().data[0].id
    except openai.APIError as exc:
        console.print(f"[red]error:[/red] cannot use the server at {url}: {exc}. Start one with `kvserve serve`.")
        raise typer.Exit(1) from None
    console.print(f"[dim]Chatting with {model} at {url}.[/dim]")

    def reply(messages: list[Message]) -> Iterator[str]:
        stream = client.chat.completions.create(
            model=model, messages=messages, stream=True, max_tokens=params.max_tokens,  # type: ignore[arg-type]
            temperature=params.temperature, top_p=params.top_p, seed=params.seed,
        )  # fmt: skip
        with stream:  # leaving early closes the connection, which aborts the request on the server
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    yield chunk.choices[0].delta.content

    return reply


def _local_replier(config: EngineConfig, params: SamplingParams, console: Console) -> Replier:
    from kvserve.chat_template import render_chat
    from kvserve.engine.llm_engine import LLMEngine
    from kvserve.loader.default_model import EMBEDDED_MODEL_NAME

    with console.status(f"Loading {config.model.model or EMBEDDED_MODEL_NAME} ..."):
        engine = LLMEngine(config)
    ids = itertools.count()

    def reply(messages: list[Message]) -> Iterator[str]:
        request_id = f"chat-{next(ids)}"
        _, prompt = render_chat(engine.tokenizer, messages)
        engine.add_request(request_id, engine.check_request(prompt, params))
        try:
            while engine.has_unfinished_requests():
                for output in engine.step():
                    yield "".join(c.text for c in output.outputs)
        finally:
            engine.abort_request(request_id)  # a no-op once finished; frees the blocks after Ctrl-C

    return reply
