"""One generation request on the server: admission, its engine streams and choices, its answer."""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import ClassVar, TypeVar

from fastapi import Request, Response
from pydantic import BaseModel

from kvserve.outputs import RequestOutput
from kvserve.sampling_params import SamplingParams
from kvserve.server.choices import Choices
from kvserve.server.protocol import GenerationRequest, read_body
from kvserve.server.state import ServerState

Body = TypeVar("Body", bound=GenerationRequest)


async def admit(request: Request, model: type[Body]) -> tuple[ServerState, Body]:
    """The server state and the parsed body, once the engine is known to run and the model to be served."""
    state: ServerState = request.app.state.server
    body = await read_body(request, model)
    state.check_ready()
    await state.check_model(body.model)
    return state, body


class GenerationRun(ABC):
    """A validated request's generation over its prompts, answered as one response or as SSE chunks."""

    id_prefix: ClassVar[str]

    def __init__(
        self, state: ServerState, body: GenerationRequest, params: SamplingParams, prompts: list[list[int]]
    ) -> None:
        self.requests = state.validate(prompts, params, body.priority, body.constraint_renames(), body.model)
        self.state = state
        self.model_name = body.model if body.model in state.adapters else state.model_name
        """The name the answer reports: the adapter's when the request named one."""
        self.tokenizer = state.tokenizer_for(self.model_name)
        """What decodes the answer's tokens (logprobs, echo): the adapter's own tokenizer if it ships one."""
        self.params = params
        self.prompts = prompts
        self.stream = bool(body.stream)
        self.include_usage = body.include_usage
        self.id = f"{self.id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.choices = Choices([len(p) for p in prompts], params.n)

    def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Delta outputs of every prompt, tagged with the prompt's index."""
        return self.state.generate(self.requests)

    async def respond(self, request: Request) -> Response:
        sequences = len(self.prompts) * self.params.n
        return await self.state.respond(request, sequences, self.stream, self.events, self.response)

    @abstractmethod
    async def response(self) -> BaseModel:
        """The whole answer, once every choice has finished."""

    @abstractmethod
    def events(self) -> AsyncIterator[str]:
        """The answer as server-sent events (``data: [DONE]`` is added after them)."""
