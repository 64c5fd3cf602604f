"""``AsyncLLM``: many concurrent async consumers served by one batched step loop.

The engine lives on a dedicated thread (a forward pass blocks), so the event loop stays
free for I/O. Requests and aborts cross over through a queue and are applied between steps;
outputs come back through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any

from kvserve.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.errors import EngineDeadError, RequestError
from kvserve.outputs import RequestOutput
from kvserve.sampling_params import SamplingParams

logger = logging.getLogger("kvserve")


class AsyncLLM:
    """The engine behind an async API; ``dead_error`` is set once its loop has died.

    Every ``generate()`` in flight when the loop ends (a failed step, or :meth:`shutdown`)
    gets EngineDeadError at once, and so does every later call: streams are registered and
    the loop's end is declared under one lock, so no stream can slip in between unanswered.
    """

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._closed: str | None = None
        """Why the loop no longer serves (set under ``_lock``); None while it runs."""
        self._wake = threading.Event()
        self._stopped = False
        self.dead_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kvserve-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncLLM:
        return cls(LLMEngine(config))

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Yield outputs as the request progresses (per ``params.output_kind``), the last one finished.

        Invalid requests raise before anything is queued. Leaving the iterator early (a client
        disconnect, a cancelled task) aborts the request and frees its KV blocks. A request the
        engine failed raises RequestError (its last output attached); a stopped engine raises
        EngineDeadError.
        """
        if self._closed is not None:
            raise EngineDeadError(self._closed)
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.engine.validate_prompt(token_ids, params)
        stream: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if self._closed is not None:
                raise EngineDeadError(self._closed)
            if request_id in self._streams:
                raise ValueError(f"request_id: {request_id!r} is already in use")
            self._streams[request_id] = (asyncio.get_running_loop(), stream)
        self._send("add", dict(request_id=request_id, prompt_token_ids=token_ids, params=params,
                               priority=priority, prompt=text, cache_salt=cache_salt))  # fmt: skip
        finished = False
        try:
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
                self._streams.pop(request_id, None)
            if not finished:
                self._send("abort", request_id)

    async def abort(self, request_id: str) -> None:
        """Stop ``request_id``; its blocks are freed before the next step."""
        self._send("abort", request_id)

    def shutdown(self) -> None:
        """Stop the loop after the current step; in-flight and later requests get EngineDeadError."""
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=30)

    def _send(self, command: str, payload: Any) -> None:
        self._commands.put((command, payload))
        self._wake.set()

    def _run(self) -> None:
        reason = "engine is shut down"
        try:
            while not self._stopped:
                self._apply_commands()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait()
                    self._wake.clear()
                    continue
                for output in self.engine.step():
                    self._deliver(output.request_id, output)
        except BaseException as exc:  # report to every waiting consumer instead of hanging them
            if isinstance(exc, EngineDeadError):
                logger.error("engine loop died: %s", exc)  # the engine logged the traceback
            else:
                logger.exception("engine loop died")
            self.dead_error = exc
            reason = f"engine loop died: {exc!r}"
        finally:
            with self._lock:
                self._closed = reason
                waiting = list(self._streams)
            for request_id in waiting:
                self._deliver(request_id, EngineDeadError(reason))
            for request_id in list(self.engine.states):
                with suppress(Exception):  # a dead engine may fail to abort; its requests are answered
                    self.engine.abort_request(request_id)

    def _apply_commands(self) -> None:
        while True:
            try:
                command, payload = self._commands.get_nowait()
            except queue.Empty:
                return
            if command == "abort":
                self.engine.abort_request(payload)
                continue
            try:
                self.engine.add_request(**payload)
            except Exception as exc:  # validated before queueing; anything left still reaches its caller
                self._deliver(payload["request_id"], exc)

    def _deliver(self, request_id: str, item: Any) -> None:
        target = self._streams.get(request_id)
        if target is not None:
            loop, stream = target
            with suppress(RuntimeError):  # its event loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(stream.put_nowait, item)
