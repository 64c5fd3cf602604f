"""``AsyncLLM``: many concurrent async consumers served by one batched step loop.

The frontend (this class: tokenization, validation, the streams) drives an engine core through an
:class:`~kvserve.frontend.client.EngineCoreClient`: on a thread of this process, or in its own
process behind ZeroMQ (``server.engine_process``), so the server's HTTP, JSON and SSE work never
takes the GIL from the step loop. Each step's outputs come back in one ``loop.call_soon_threadsafe`` (one
wake-up of the event loop per step, not per request), into each request's
:class:`~kvserve.frontend.output_stream.OutputStream`.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from typing import Any

from kvserve.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.stats import EngineStats
from kvserve.engine.validation import CheckedRequest
from kvserve.errors import EngineDeadError, RequestError
from kvserve.frontend.client import EngineCoreClient
from kvserve.frontend.output_stream import OutputStream
from kvserve.frontend.parallel_sampling import ParentRequest, ParentStream
from kvserve.frontend.thread_client import ThreadClient
from kvserve.lora.request import LoRARequest
from kvserve.outputs import RequestOutput
from kvserve.sampling_params import SamplingParams


class AsyncLLM:
    """The engine behind an async API; ``dead_error`` is set once its core has died.

    Every ``generate()`` in flight when the core stops (a failed step, a dead core process, or
    :meth:`shutdown`) gets EngineDeadError at once, and so does every later call: streams are
    registered and the core's end is declared under one lock, so no stream can slip in between
    unanswered.
    """

    def __init__(self, engine: LLMEngine | EngineCoreClient) -> None:
        """Serve ``engine``: an ``LLMEngine`` (stepped on a thread of this process) or a client of one."""
        self.client: EngineCoreClient = ThreadClient(engine) if isinstance(engine, LLMEngine) else engine
        self.engine: LLMEngine | None = getattr(self.client, "engine", None)
        """The engine itself when it runs in this process; None when it has its own."""
        self.info = self.client.info
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, OutputStream | ParentStream | _Answer]] = {}
        self._children: dict[str, list[str]] = {}
        """The engine's request ids of each ``n > 1`` request in flight (see :meth:`generate`)."""
        self._lock = threading.Lock()
        self._closed: str | None = None
        """Why the core no longer serves (set under ``_lock``); None while it runs."""
        self.dead_error: BaseException | None = None
        self.client.start(self)

    @classmethod
    def from_config(cls, config: EngineConfig, *, core_setup: Callable[[LLMEngine], Any] | None = None) -> AsyncLLM:
        """Load the engine, with the defaults of one that serves streams (``EngineConfig.for_serving``):
        in its own process if ``config.server.engine_process``, where the picklable ``core_setup``
        runs on it before it serves (instrumentation; tests inject faults with it)."""
        config = config.for_serving()
        if config.server.engine_process:
            from kvserve.frontend.process_client import ProcessClient  # pyzmq: the server extra

            return cls(ProcessClient(config, core_setup))

        def build() -> LLMEngine:  # on the step loop's thread (see ThreadClient)
            engine = LLMEngine(config)
            if core_setup is not None:
                core_setup(engine)
            return engine

        return cls(ThreadClient(build))

    @property
    def tokenizer(self) -> Any:
        """The engine's tokenizer (a copy of it when the engine has its own process)."""
        return self.info.tokenizer

    def stats(self) -> EngineStats:
        """The engine's counters and gauges (for ``/metrics``)."""
        return self.client.stats()

    def validate_prompt(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> CheckedRequest:
        """The request checked for :meth:`generate`: raises naming the field if it can never be served
        (see ``check_request``), EngineDeadError once the core has stopped. Nothing reaches the core."""
        if self._closed is not None:
            raise EngineDeadError(self._closed)
        return self.info.check_request(
            prompt_token_ids, params, prompt=prompt, priority=priority, cache_salt=cache_salt,
            lora_request=lora_request,
        )  # fmt: skip

    async def generate(
        self,
        prompt: str | list[int] | CheckedRequest,
        params: SamplingParams | None,
        request_id: str,
        priority: int = 0,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield outputs as the request progresses (per ``params.output_kind``), the last one finished.

        ``prompt``: text or token ids, checked here with ``params``, ``priority``, ``cache_salt`` and
        ``lora_request`` (the adapter it runs with; the engine reads it, and a bad one fails the request);
        or a request :meth:`validate_prompt` checked (then ``params`` is None), not checked again.
        Invalid requests raise before anything is queued. ``n > 1`` runs as ``n`` engine requests
        whose outputs are merged (:class:`~kvserve.frontend.parallel_sampling.ParentRequest`).
        Leaving the iterator early (a client disconnect, a cancelled task) aborts the request and
        frees its KV blocks. A request the engine failed raises RequestError (its last output
        attached); a stopped engine raises EngineDeadError.
        """
        if isinstance(prompt, CheckedRequest):
            if params is not None:
                raise TypeError("params: a checked request carries its own sampling parameters; pass None")
            request = prompt
        else:
            text = prompt if isinstance(prompt, str) else None
            token_ids = self.info.tokenizers.of(lora_request).encode(prompt) if text is not None else list(prompt)
            request = self.validate_prompt(
                token_ids, params, prompt=text, priority=priority, cache_salt=cache_salt, lora_request=lora_request
            )
        stream = OutputStream(delta=request.params.output_kind == "delta")
        parent = ParentRequest(request_id, request) if request.params.n > 1 else None
        engine_requests = parent.children if parent is not None else {request_id: request}
        ids = [request_id, *parent.children] if parent is not None else [request_id]
        with self._lock:
            if self._closed is not None:
                raise EngineDeadError(self._closed)
            for taken in ids:
                if taken in self._streams:
                    raise ValueError(f"request_id: {taken!r} is already in use")
            target = (asyncio.get_running_loop(), stream if parent is None else ParentStream(parent, stream))
            self._streams.update(dict.fromkeys(ids, target))
            if parent is not None:
                self._children[request_id] = list(engine_requests)
        finished = False
        try:
            for engine_id, engine_request in engine_requests.items():
                self.client.add_request(dict(request_id=engine_id, request=engine_request))
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    finished = True  # the engine holds nothing more of it
                    raise item
                finished = item.finished
                if item.error is not None:
                    raise RequestError(f"request {request_id!r} failed: {item.error}", item)
                yield item
        finally:
            with self._lock:
                for taken in ids:
                    self._streams.pop(taken, None)
                self._children.pop(request_id, None)
            if parent is not None:  # its other samples run on when one fails or is refused: abort them too
                leftover = parent.unfinished_children()
            else:
                leftover = [] if finished else [request_id]
            for engine_id in leftover:
                self.client.abort_request(engine_id)

    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Load ``lora_request``'s adapter into the engine now, between two steps: read and checked there
        (ValueError naming the problem, as ``LoRAManager.load``; the engine serves on), then requests may
        name it. EngineDeadError once the core has stopped."""
        await self._call("add_lora", lora_request)

    async def remove_lora(self, lora_int_id: int) -> None:
        """Unload adapter ``lora_int_id`` (unknown ids are ignored): requests already sent with it finish
        with it, and its host copy and slot are freed after the last one."""
        await self._call("remove_lora", lora_int_id)
        self.info.tokenizers.forget(lora_int_id)

    async def _call(self, kind: str, argument: Any) -> None:
        """Send the command ``(kind, call_id, argument)`` and wait for its answer; raise the error it carries."""
        call_id = f"{kind}-{uuid.uuid4().hex}"
        answer = _Answer()
        with self._lock:
            if self._closed is not None:
                raise EngineDeadError(self._closed)
            self._streams[call_id] = (asyncio.get_running_loop(), answer)
        try:
            self.client.call((kind, call_id, argument))
            result = await answer.future
        finally:
            with self._lock:
                self._streams.pop(call_id, None)
        if isinstance(result, BaseException):
            raise result

    async def abort(self, request_id: str) -> None:
        """Stop ``request_id`` (every sample of an ``n > 1`` request); its blocks are freed before the next step."""
        for engine_id in self._children.get(request_id, [request_id]):
            self.client.abort_request(engine_id)

    def shutdown(self) -> None:
        """Stop the core after the current step; in-flight and later requests get EngineDeadError."""
        self.client.shutdown()

    # -- OutputSink: called by the core, from its thread -----------------------------------
    def deliver(self, request_id: str, item: Any) -> None:
        """Hand ``item`` to ``request_id``'s stream, if anyone still waits for it."""
        target = self._streams.get(request_id)
        if target is not None:
            loop, stream = target
            with suppress(RuntimeError):  # its event loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(stream.put, item)

    def deliver_step(self, outputs: list[RequestOutput]) -> None:
        """Hand one step's outputs over: one call into each consumer's event loop for all of them."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[OutputStream, RequestOutput]]] = {}
        streams = self._streams
        for output in outputs:
            target = streams.get(output.request_id)
            if target is not None:
                by_loop.setdefault(target[0], []).append((target[1], output))
        for loop, items in by_loop.items():
            with suppress(RuntimeError):  # its event loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(_put_all, items)

    def close(self, reason: str, error: BaseException | None) -> None:
        """Declare the core's end and answer every waiting stream with EngineDeadError(``reason``)."""
        with self._lock:
            self._closed = reason
            self.dead_error = error
            waiting = list(self._streams)
        for request_id in waiting:
            self.deliver(request_id, EngineDeadError(reason))


class _Answer:
    """Where the answer to one engine command lands (an exception: the command failed, or the core died)."""

    def __init__(self) -> None:
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def put(self, item: Any) -> None:
        if not self.future.done():
            self.future.set_result(item)


def _put_all(items: list[tuple[OutputStream, RequestOutput]]) -> None:
    for stream, output in items:
        stream.put(output)
