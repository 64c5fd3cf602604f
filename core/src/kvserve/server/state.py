"""What every route shares: the engine, the served model name, admission checks and the concurrency limit."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request, Response
from pydantic import BaseModel

from kvserve.chat_template import load_chat_template
from kvserve.config import ServerConfig
from kvserve.engine.validation import CheckedRequest
from kvserve.errors import CapacityError
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.loader.default_model import EMBEDDED_MODEL_NAME
from kvserve.lora.peft_adapter import read_adapter_config
from kvserve.lora.request import LoRARequest
from kvserve.outputs import RequestOutput
from kvserve.reasoning import reasoning_parser_class
from kvserve.sampling_params import SamplingParams
from kvserve.server.errors import OpenAIError, engine_dead, engine_error
from kvserve.server.limits import RequestLimits
from kvserve.server.metrics import ServerMetrics
from kvserve.server.serving_tools import auto_tool_parser
from kvserve.server.streaming import EventStreamResponse, cancel_on_disconnect, guarded_events, merge_streams


class ServerState:
    """Admission (ready? known model? within the limits? free slots? a servable prompt?) and generation
    over ``AsyncLLM``."""

    def __init__(self, llm: AsyncLLM, config: ServerConfig, model_name: str | None = None) -> None:
        self.llm = llm
        self.config = config
        self.model_name = config.served_model_name or model_name or EMBEDDED_MODEL_NAME
        self.adapters = self._adapters(config)
        """The ``lora_modules`` by name: a request whose ``model`` is one of them runs with that adapter."""
        self.metrics = ServerMetrics(llm.stats)
        self.limits = RequestLimits(config, llm.info.vocab_size)
        self.reasoning_parser = reasoning_parser_class(config.reasoning_parser)
        """The ``--reasoning-parser`` class (loaded now: an unknown name stops the start), or None."""
        self.created = int(time.time())
        self.chat_template = load_chat_template(config.chat_template)
        """The chat template used instead of the tokenizer's (None: the tokenizer's)."""
        self.auto_tool_parser = auto_tool_parser(config)
        """The parser of ``tool_choice="auto"`` (None: auto is refused)."""
        self.accepting = True
        """False once shutdown begins."""
        self.in_flight = 0
        """Sequences (``n`` per prompt) of the generation requests admitted and not yet answered in full."""

    @property
    def tokenizer(self) -> Any:
        return self.llm.tokenizer

    def check_ready(self) -> None:
        if self.llm.dead_error is not None:
            raise engine_dead()
        if not self.accepting:
            raise OpenAIError(503, "the server is shutting down", code="shutting_down")

    def _adapters(self, config: ServerConfig) -> dict[str, LoRARequest]:
        """The LoRA adapters served by name (ids from 1 in the order given), each adapter directory's
        config checked now: a missing or refused adapter stops the start, naming it."""
        adapters = {}
        for lora_int_id, module in enumerate(config.lora_modules, start=1):
            if module.name == self.model_name:
                raise ValueError(f"lora_modules: adapter name {module.name!r} is the base model's served name")
            adapter = LoRARequest(module.name, lora_int_id, module.path, module.base_model_name)
            read_adapter_config(adapter)
            adapters[module.name] = adapter
        return adapters

    def check_model(self, name: str | None) -> None:
        """``None`` (vLLM allows omitting it) means the served model; an adapter's name means that adapter."""
        if name is not None and name != self.model_name and name not in self.adapters:
            served = ", ".join(repr(n) for n in [self.model_name, *self.adapters])
            raise OpenAIError(
                404,
                f"model {name!r} does not exist; this server serves {served}",
                "model",
                "model_not_found",
            )

    def validate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        priority: int,
        renames: dict[str, str] | None = None,
        model: str | None = None,
    ) -> list[CheckedRequest]:
        """Each prompt checked, once, before anything is queued or streamed: a prompt the engine could
        never serve is refused (400, naming the field, as ``renames`` has it); :meth:`generate` takes the
        checked requests, with the LoRA adapter ``model`` names (none for the base model)."""
        lora_request = self.adapters.get(model) if model is not None else None
        try:
            return [
                self.llm.validate_prompt(token_ids, params, priority=priority, lora_request=lora_request)
                for token_ids in prompts
            ]
        except (ValueError, CapacityError) as exc:  # the message names the field
            raise engine_error(exc, renames) from None

    def acquire_slots(self, sequences: int) -> None:
        """Count a request's ``sequences`` in flight, or refuse with 429 if they would go over the limit."""
        limit = self.config.max_concurrent_sequences
        if self.in_flight + sequences > limit:
            raise OpenAIError(
                429,
                f"too many sequences in flight ({self.in_flight} of {limit}, this request adds {sequences}); "
                "retry later",
                code="too_many_requests",
            )
        self.in_flight += sequences

    def release_slots(self, sequences: int) -> None:
        self.in_flight -= sequences

    def generate(self, requests: list[CheckedRequest]) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Outputs of every (validated) prompt as they come, tagged with the prompt's index."""
        base = uuid.uuid4().hex
        streams = [
            self.metrics.observe(self.llm.generate(request, None, f"{base}-{i}")) for i, request in enumerate(requests)
        ]
        return merge_streams(streams)

    async def respond(
        self,
        request: Request,
        sequences: int,
        stream: bool,
        events: Callable[[], AsyncIterator[str]],
        final: Callable[[], Awaitable[BaseModel]],
    ) -> Response:
        """Admit a generation request of ``sequences`` and answer it: with SSE ``events``, or with the
        ``final`` JSON body.

        Its slots are held until the answer is complete or the client has gone.
        """
        self.acquire_slots(sequences)
        if stream:
            return EventStreamResponse(guarded_events(events()), on_close=lambda: self.release_slots(sequences))
        try:
            result = await cancel_on_disconnect(request, final())
        finally:
            self.release_slots(sequences)
        return Response(result.model_dump_json(), media_type="application/json")
