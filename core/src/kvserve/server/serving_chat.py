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
from kvserve.server.serving_tools import ToolReply, ToolUse
from kvserve.server.state import ServerState
from kvserve.server.streaming import sse_event
from kvserve.tool_calling.template import conversation_for_template

router = APIRouter()


def chat_prompt(
    state: ServerState,
    tokenizer: Any,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The conversation's prompt token ids through ``tokenizer`` (its template unless the server has one);
    a conversation the template cannot render is a 400."""
    conversation = [m.template_input() for m in messages]
    template = None
    if state.chat_template or tokenizer.chat_template:
        # As transformers picks it: a tokenizer may hold several (e.g. "default" and "tool_use").
        template = tokenizer.get_chat_template(state.chat_template, tools or None)
        conversation, tools = conversation_for_template(template, conversation, tools)
    try:
        _, token_ids = render_chat(
            tokenizer, conversation, add_generation_prompt,
            tools=tools, chat_template=template, template_kwargs=template_kwargs,
        )  # fmt: skip
    except ChatTemplateError as exc:
        raise OpenAIError(400, str(exc), param=exc.param, code="invalid_messages") from None
    return token_ids


@router.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
async def create_chat_completion(request: Request) -> Response:
    state, body = await admit(request, ChatCompletionRequest)
    state.limits.check(body, num_prompts=1)
    tool_use = ToolUse.of(body, state.auto_tool_parser)
    tokenizer = state.tokenizer_for(body.model)
    params = tool_use.sampling_params(body.sampling_params(state.llm.info.default_sampling_fields), tokenizer)
    template_kwargs = body.chat_template_kwargs or {}
    # Rendering and tokenizing a long conversation takes a while: then off the event loop, so streams go on.
    text = sum(len(m.template_input()["content"]) for m in body.messages)
    messages, tools = body.messages, tool_use.tools
    prompt = await tokenizer_work(
        text, lambda: chat_prompt(state, tokenizer, messages, body.add_generation_prompt, tools, template_kwargs)
    )
    return await _ChatRun(state, body, params, [prompt], tool_use).respond(request)


class _ChatRun(GenerationRun):
    """A chat request: one templated prompt, ``n`` assistant replies."""

    id_prefix = "chatcmpl"

    def __init__(
        self, state: ServerState, body: ChatCompletionRequest, params: SamplingParams, prompts: list[list[int]],
        tool_use: ToolUse,
    ) -> None:  # fmt: skip
        super().__init__(state, body, params, prompts)
        self.tool_use = tool_use
        self.reasoning = ChatReasoning(state.reasoning_parser, self.tokenizer, body.chat_template_kwargs)
        self.replies = [
            None if (parser := tool_use.new_parser(self.tokenizer)) is None else ToolReply(tool_use, parser)
            for _ in self.choices.choices
        ]
        """Per choice, what reads its tool calls (None: a text reply)."""

    def _finish_reason(self, index: int, reason: str | None) -> str | None:
        reply = self.replies[index]
        return self.tool_use.finish_reason(reason, reply is not None and reply.called)

    def _logprobs(self, token_ids: list[int], logprobs: list[TokenLogprobs] | None) -> ChatLogprobs | None:
        if self.params.logprobs is None:
            return None
        return chat_logprobs(self.tokenizer, token_ids, logprobs or [], self.params.logprobs)

    async def response(self) -> ChatCompletionResponse:
        async for _, output in self.outputs():
            self.choices.add(0, output)
        choices = []
        for c in self.choices.choices:
            reply = self.replies[c.index]
            reasoning, text = self.reasoning.split(c.index, c.text)
            content, calls = (text, None) if reply is None else reply.whole(text or "")
            choices.append(
                ChatChoice(
                    index=c.index, message=self.reasoning.message(reasoning, content, calls),
                    logprobs=self._logprobs(c.token_ids, c.logprobs),
                    finish_reason=self._finish_reason(c.index, c.finish_reason), stop_reason=c.stop_reason,
                )
            )  # fmt: skip
        return ChatCompletionResponse(
            id=self.id, created=self.created, model=self.model_name, choices=choices, usage=self.choices.usage()
        )

    async def events(self) -> AsyncIterator[str]:
        # As OpenAI does: each choice opens with the role, then content deltas, the last with finish_reason.
        for choice in self.choices.choices:
            yield sse_event(
                self._chunk([ChatChunkChoice(index=choice.index, delta=DeltaMessage(role="assistant", content=""))])
            )
        async for _, output in self.outputs():
            for choice, delta in self.choices.add(0, output):
                reply, finished = self.replies[choice.index], choice.finish_reason is not None
                reasoning, text = self.reasoning.split_delta(choice.index, delta.text, finished)
                content, calls = (text, None) if reply is None else reply.delta(text or "", finished)
                logprobs = self._logprobs(delta.token_ids, delta.logprobs)
                parsed = reply is not None or self.reasoning.parser_class is not None
                if parsed and not (reasoning or content or calls or logprobs or finished):
                    continue  # text a parser holds back: nothing to send yet
                piece = ChatChunkChoice(
                    index=choice.index, delta=self.reasoning.delta(reasoning, content, calls), logprobs=logprobs,
                    finish_reason=self._finish_reason(choice.index, choice.finish_reason),
                    stop_reason=choice.stop_reason,
                )  # fmt: skip
                yield sse_event(self._chunk([piece]))
        if self.include_usage:
            yield sse_event(self._chunk([], self.choices.usage()))

    def _chunk(self, choices: list[ChatChunkChoice], usage: UsageInfo | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.id, created=self.created, model=self.model_name, choices=choices, usage=usage
        )
