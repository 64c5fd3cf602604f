"""What every route shares: the engine, the served model name, admission checks and the concurrency limit."""

from __future__ import annotations

import asyncio
import logging
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
from kvserve.interfaces.lora_resolver import LoRAResolver
from kvserve.loader.default_model import EMBEDDED_MODEL_NAME
from kvserve.lora.peft_adapter import read_adapter_config
from kvserve.lora.request import LoRARequest
from kvserve.outputs import RequestOutput
from kvserve.plugins import get_plugin_manager, load_component
from kvserve.reasoning import reasoning_parser_class
from kvserve.sampling_params import SamplingParams
from kvserve.server.errors import OpenAIError, engine_dead, engine_error
from kvserve.server.limits import RequestLimits
from kvserve.server.metrics import ServerMetrics
from kvserve.server.serving_tools import auto_tool_parser
from kvserve.server.streaming import EventStreamResponse, cancel_on_disconnect, guarded_events, merge_streams

logger = logging.getLogger("kvserve")


class ServerState:
    """Admission (ready? known model? within the limits? free slots? a servable prompt?) and generation
    over ``AsyncLLM``."""

    def __init__(self, llm: AsyncLLM, config: ServerConfig, model_name: str | None = None) -> None:
        self.llm = llm
        self.config = config
        self.model_name = config.served_model_name or model_name or EMBEDDED_MODEL_NAME
        self.adapters = self._adapters(config)
        """The adapters served by name (``lora_modules``, then those loaded at run time): a request whose
        ``model`` is one of them runs with that adapter."""
        for adapter in self.adapters.values():  # read now: an unreadable tokenizer an adapter ships stops the start
            llm.info.tokenizers.of(adapter)
        self.next_lora_id = len(self.adapters) + 1
        """The id of the next adapter loaded at run time: ids are never reused (an unloaded adapter's
        requests may still run with its id)."""
        self.resolvers = self._resolvers(config)
        """The ``lora_resolver`` plugins, with ``allow_runtime_lora_updating``; none otherwise."""
        self.lora_lock = asyncio.Lock()
        """Held while an adapter is loaded, resolved or unloaded: one change of :attr:`adapters` at a time."""
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

    def tokenizer_for(self, model: str | None) -> Any:
        """The tokenizer of requests naming ``model``: an adapter's own if it ships one, else the model's."""
        return self.llm.info.tokenizers.of(self.adapters.get(model))

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

    @staticmethod
    def _resolvers(config: ServerConfig) -> list[LoRAResolver]:
        if not config.allow_runtime_lora_updating:
            return []
        names = get_plugin_manager().registry("lora_resolver").names()
        return [load_component("lora_resolver", name)(config) for name in names]

    async def load_adapter(self, name: str, path: str) -> LoRARequest:
        """Serve the adapter in ``path`` as ``name`` from now on (``/v1/load_lora_adapter``): a 400 naming
        the problem for a name already served or an adapter the engine refuses."""
        async with self.lora_lock:
            if name == self.model_name or name in self.adapters:
                raise OpenAIError(400, f"lora_name: {name!r} is already served; unload it first", "lora_name")
            return await self._load(LoRARequest(name, self.next_lora_id, path))

    async def _load(self, adapter: LoRARequest) -> LoRARequest:
        """Load ``adapter`` into the engine (under :attr:`lora_lock`) and serve it by its name."""
        try:
            await asyncio.to_thread(self.llm.info.tokenizers.of, adapter)  # read off the event loop, once
            await self.llm.add_lora(adapter)
        except ValueError as exc:  # the message names the adapter and what is wrong with it
            raise OpenAIError(400, str(exc), "lora_path", "invalid_lora_adapter") from None
        self.next_lora_id += 1
        self.adapters[adapter.lora_name] = adapter
        logger.info("LoRA adapter %r (id %d) served from %s", adapter.lora_name, adapter.lora_int_id, adapter.lora_path)
        return adapter

    async def unload_adapter(self, name: str) -> None:
        """Stop serving adapter ``name`` (``/v1/unload_lora_adapter``; 404 if it is not served): later
        requests naming it get 404, those already admitted finish with it, and the engine frees it after them."""
        async with self.lora_lock:
            adapter = self.adapters.pop(name, None)
            if adapter is None:
                raise OpenAIError(404, f"lora_name: no adapter {name!r} is served", "lora_name", "model_not_found")
            await self.llm.remove_lora(adapter.lora_int_id)
        logger.info("LoRA adapter %r (id %d) unloaded", name, adapter.lora_int_id)

    async def check_model(self, name: str | None) -> None:
        """``None`` (vLLM allows omitting it) means the served model; an adapter's name means that adapter;
        another name is looked up with the resolvers (when runtime updates are on) and loaded, else a 404."""
        if name is None or name == self.model_name or name in self.adapters:
            return
        if self.resolvers:
            async with self.lora_lock:
                if name in self.adapters or await self._resolve(name):  # another request may have loaded it
                    return
        served = ", ".join(repr(n) for n in [self.model_name, *self.adapters])
        raise OpenAIError(
            404,
            f"model {name!r} does not exist; this server serves {served}",
            "model",
            "model_not_found",
        )

    async def _resolve(self, name: str) -> bool:
        """Ask each resolver for adapter ``name`` and load the first one found (a 400 if the engine refuses
        it); False if none knows it. A resolver that fails or answers for another name is logged and passed."""
        for resolver in self.resolvers:
            try:
                found = await resolver.resolve_lora(self.model_name, name)
            except Exception:
                logger.exception("lora_resolver %r failed to resolve %r", resolver.name, name)
                continue
            if found is None:
                continue
            if found.lora_name != name:
                logger.error("lora_resolver %r answered %r for adapter %r", resolver.name, found.lora_name, name)
                continue
            await self._load(LoRARequest(name, self.next_lora_id, found.lora_path, found.base_model_name))
            return True
        return False

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
        lora_request = None if model is None or model == self.model_name else self.adapters.get(model)
        if model is not None and model != self.model_name and lora_request is None:
            # Unloaded since the request was admitted: never answer it with the base model instead.
            raise OpenAIError(404, f"model {model!r} does not exist (it was just unloaded)", "model", "model_not_found")
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
        lora_request = requests[0].lora_request  # one request's prompts share its model
        if lora_request is not None:
            self.metrics.lora_requests.labels(lora_request.lora_name).inc()
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
