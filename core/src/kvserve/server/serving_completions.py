"""``POST /v1/completions``: text in (one or many prompts, as text or token ids), text out."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response

from kvserve.outputs import CompletionOutput, RequestOutput, TokenLogprobs
from kvserve.sampling_params import SamplingParams
from kvserve.server.choices import Choice, Choices
from kvserve.server.logprobs import completion_logprobs
from kvserve.server.protocol import CompletionChoice, CompletionRequest, CompletionResponse, UsageInfo, read_body
from kvserve.server.state import ServerState, new_id
from kvserve.server.streaming import sse_event

router = APIRouter()


@router.post("/v1/completions")
async def create_completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await read_body(request, CompletionRequest)
    state.check_ready()
    state.check_model(body.model)
    tokenizer = state.tokenizer
    texts = [p if isinstance(p, str) else tokenizer.decode(p) for p in body.prompts()]
    prompts = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in body.prompts()]
    params = body.sampling_params()
    state.validate(prompts, params)
    run = _CompletionRun(state, body, params, prompts, texts)
    return await state.respond(request, bool(body.stream), run.events, run.response)


class _CompletionRun:
    """One request's generation, shaped as a single response or as chunks."""

    def __init__(
        self,
        state: ServerState,
        body: CompletionRequest,
        params: SamplingParams,
        prompts: list[list[int]],
        texts: list[str],
    ) -> None:
        self.state = state
        self.body = body
        self.params = params
        self.prompts = prompts
        self.texts = texts
        """The prompts as text, for ``echo``."""
        self.id = new_id("cmpl")
        self.created = int(time.time())
        self.choices = Choices([len(p) for p in prompts], params.n)

    def _generate(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        return self.state.generate(self.prompts, self.params, self.body.priority)

    async def response(self) -> CompletionResponse:
        async for prompt_index, output in self._generate():
            self.choices.add(prompt_index, output)
        pieces = [self._piece(c, c.text, c.token_ids, c.logprobs, first=True) for c in self.choices.choices]
        return self._wrap(pieces, self.choices.usage())

    async def events(self) -> AsyncIterator[str]:
        async for prompt_index, output in self._generate():
            for choice, delta in self.choices.add(prompt_index, output):
                yield sse_event(self._wrap([self._delta_piece(choice, delta)]))
        if self.body.include_usage:
            yield sse_event(self._wrap([], self.choices.usage()))

    def _delta_piece(self, choice: Choice, delta: CompletionOutput) -> CompletionChoice:
        first = choice.sent_chars == 0 and len(choice.token_ids) == len(delta.token_ids)
        piece = self._piece(choice, delta.text, delta.token_ids, delta.logprobs or [], first)
        choice.sent_chars += len(piece.text)
        return piece

    def _piece(
        self, choice: Choice, text: str, token_ids: list[int], logprobs: list[TokenLogprobs], first: bool
    ) -> CompletionChoice:
        """A choice's ``text`` (the prompt first with ``echo`` on a first piece) and its logprobs."""
        token_logprobs: list[TokenLogprobs | None] = list(logprobs)
        if first and self.body.echo:
            prompt_ids = self.prompts[choice.prompt_index]
            text = self.texts[choice.prompt_index] + text
            token_ids = prompt_ids + token_ids
            token_logprobs = self.choices.prompt_logprobs.get(choice.prompt_index, []) + token_logprobs
        lp = None
        if self.params.logprobs is not None:
            lp = completion_logprobs(self.state.tokenizer, token_ids, token_logprobs, choice.sent_chars)
        return CompletionChoice(
            index=choice.index, text=text, logprobs=lp, finish_reason=choice.finish_reason,
            stop_reason=choice.stop_reason,
        )  # fmt: skip

    def _wrap(self, choices: list[CompletionChoice], usage: UsageInfo | None = None) -> CompletionResponse:
        return CompletionResponse(
            id=self.id, created=self.created, model=self.state.model_name, choices=choices, usage=usage
        )
