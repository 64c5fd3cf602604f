"""``POST /v1/completions``: text in (one or many prompts, as text or token ids), text out."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request, Response

from kvserve.outputs import CompletionOutput, TokenLogprobs
from kvserve.sampling_params import SamplingParams
from kvserve.server.choices import Choice
from kvserve.server.generation import GenerationRun, admit
from kvserve.server.logprobs import completion_logprobs
from kvserve.server.offload import tokenizer_work
from kvserve.server.openapi import json_body
from kvserve.server.protocol import CompletionChoice, CompletionRequest, CompletionResponse, UsageInfo
from kvserve.server.state import ServerState
from kvserve.server.streaming import sse_event

router = APIRouter()


@router.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
async def create_completion(request: Request) -> Response:
    state, body = await admit(request, CompletionRequest)
    given = body.prompts()
    state.limits.check(body, len(given), (p for p in given if not isinstance(p, str)))
    params = body.sampling_params(state.llm.info.default_sampling_fields)
    tokenizer = state.tokenizer_for(body.model)
    # Tokenizing (and decoding, for echo) a long prompt takes a while: then off the event loop, so streams go on.
    text = sum(len(p) for p in given if isinstance(p, str))
    prompts = await tokenizer_work(text, lambda: [tokenizer.encode(p) if isinstance(p, str) else p for p in given])
    run = _CompletionRun(state, body, params, prompts)
    if run.echo:  # decoded only once the ids are known to be valid
        ids = sum(len(p) for p in given if not isinstance(p, str))
        run.texts = await tokenizer_work(ids, lambda: [p if isinstance(p, str) else tokenizer.decode(p) for p in given])
    return await run.respond(request)


class _CompletionRun(GenerationRun):
    """A completions request: ``n`` continuations of each prompt, the prompt first with ``echo``."""

    id_prefix = "cmpl"

    def __init__(
        self, state: ServerState, body: CompletionRequest, params: SamplingParams, prompts: list[list[int]]
    ) -> None:
        super().__init__(state, body, params, prompts)
        self.echo = bool(body.echo)
        self.texts: list[str] = []
        """The prompts as text, for ``echo``."""

    async def response(self) -> CompletionResponse:
        async for prompt_index, output in self.outputs():
            self.choices.add(prompt_index, output)
        pieces = [self._piece(c, c.text, c.token_ids, c.logprobs, first=True) for c in self.choices.choices]
        return self._wrap(pieces, self.choices.usage())

    async def events(self) -> AsyncIterator[str]:
        async for prompt_index, output in self.outputs():
            for choice, delta in self.choices.add(prompt_index, output):
                yield sse_event(self._wrap([self._delta_piece(choice, delta)]))
        if self.include_usage:
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
        if first and self.echo:
            prompt_ids = self.prompts[choice.prompt_index]
            text = self.texts[choice.prompt_index] + text
            token_ids = prompt_ids + token_ids
            token_logprobs = self.choices.prompt_logprobs.get(choice.prompt_index, []) + token_logprobs
        lp = None
        if self.params.logprobs is not None:
            lp = completion_logprobs(self.tokenizer, token_ids, token_logprobs, choice.sent_chars)
        return CompletionChoice(
            index=choice.index, text=text, logprobs=lp, finish_reason=choice.finish_reason,
            stop_reason=choice.stop_reason,
        )  # fmt: skip

    def _wrap(self, choices: list[CompletionChoice], usage: UsageInfo | None = None) -> CompletionResponse:
        return CompletionResponse(id=self.id, created=self.created, model=self.model_name, choices=choices, usage=usage)
