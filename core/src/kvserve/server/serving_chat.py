"""``POST /v1/chat/completions``: a conversation through the model's chat template, one assistant reply per choice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, Response

from kvserve.chat_template import ChatTemplateError, render_chat
from kvserve.outputs import TokenLogprobs
from kvserve.sampling_params import SamplingParams
from kvserve.server.errors import OpenAIError
from kvserve.server.generation import GenerationRun, admit
from kvserve.server.logprobs import chat_logprobs
from kvserve.server.offload import tokenizer_work
from kvserve.server.openapi import json_body
from kvserve.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    DeltaMessage,
    UsageInfo,
)
from kvserve.server.reasoning import ChatReasoning
from kvserve.server.state import ServerState
from kvserve.server.streaming import sse_event

router = APIRouter()


def chat_prompt(
    state: ServerState,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The conversation's prompt token ids; a conversation the template cannot render is a 400."""
    try:
        _, token_ids = render_chat(
            state.tokenizer, [m.template_input() for m in messages], add_generation_prompt, template_kwargs
        )
    except ChatTemplateError as exc:
        raise OpenAIError(400, str(exc), param=exc.param, code="invalid_messages") from None
    return token_ids


@router.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
async def create_chat_completion(request: Request) -> Response:
    state, body = await admit(request, ChatCompletionRequest)
    state.limits.check(body, num_prompts=1)
    params = body.sampling_params()
    # Rendering and tokenizing a long conversation takes a while: then off the event loop, so streams go on.
    text = sum(len(m.template_input()["content"]) for m in body.messages)
    prompt = await tokenizer_work(
        text, lambda: chat_prompt(state, body.messages, body.add_generation_prompt, body.chat_template_kwargs)
    )
    return await _ChatRun(state, body, params, [prompt]).respond(request)


class _ChatRun(GenerationRun):
    """A chat request: one templated prompt, ``n`` assistant replies."""

    id_prefix = "chatcmpl"

    def __init__(
        self, state: ServerState, body: ChatCompletionRequest, params: SamplingParams, prompts: list[list[int]]
    ) -> None:
        super().__init__(state, body, params, prompts)
        self.reasoning = ChatReasoning(state.reasoning_parser, state.tokenizer, body.chat_template_kwargs)

    def _logprobs(self, token_ids: list[int], logprobs: list[TokenLogprobs] | None) -> ChatLogprobs | None:
        if self.params.logprobs is None:
            return None
        return chat_logprobs(self.state.tokenizer, token_ids, logprobs or [], self.params.logprobs)

    async def response(self) -> ChatCompletionResponse:
        async for _, output in self.outputs():
            self.choices.add(0, output)
        choices = [
            ChatChoice(
                index=c.index, message=self.reasoning.message(c.index, c.text),
                logprobs=self._logprobs(c.token_ids, c.logprobs), finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
            for c in self.choices.choices
        ]  # fmt: skip
        return ChatCompletionResponse(
            id=self.id, created=self.created, model=self.state.model_name, choices=choices, usage=self.choices.usage()
        )

    async def events(self) -> AsyncIterator[str]:
        # As OpenAI does: each choice opens with the role, then content deltas, the last with finish_reason.
        for choice in self.choices.choices:
            yield sse_event(
                self._chunk([ChatChunkChoice(index=choice.index, delta=DeltaMessage(role="assistant", content=""))])
            )
        async for _, output in self.outputs():
            for choice, delta in self.choices.add(0, output):
                piece = ChatChunkChoice(
                    index=choice.index,
                    delta=self.reasoning.delta(choice.index, delta.text, choice.finish_reason is not None),
                    logprobs=self._logprobs(delta.token_ids, delta.logprobs), finish_reason=choice.finish_reason,
                    stop_reason=choice.stop_reason,
                )  # fmt: skip
                yield sse_event(self._chunk([piece]))
        if self.include_usage:
            yield sse_event(self._chunk([], self.choices.usage()))

    def _chunk(self, choices: list[ChatChunkChoice], usage: UsageInfo | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.state.model_name, choices=choices, usage=usage
        )
