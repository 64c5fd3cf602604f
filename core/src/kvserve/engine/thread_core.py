"""The engine core on a dedicated thread of the frontend's process (a forward pass blocks, so the
event loop stays free for I/O; both share the GIL). Requests and aborts cross over through a
queue and are applied between steps.

Given a factory, the engine is built on that same thread. OpenMP (torch's CPU thread pool) keeps a
pool of workers per thread that starts parallel work; once a second pool exists, libgomp counts
more threads than cores and its workers stop spin-waiting between parallel regions, so every
kernel pays a wake-up. A model loaded on the main thread and stepped on this one ran its decode
GEMMs 1.45x slower than one loaded and stepped on the same thread (2 cores, 61 GEMMs a step).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from typing import Any

from kvserve.engine.core_client import OutputSink
from kvserve.engine.engine_info import EngineInfo
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.stats import EngineStats
from kvserve.errors import EngineDeadError

logger = logging.getLogger("kvserve")


class ThreadCore:
    """:class:`~kvserve.engine.core_client.EngineCoreClient` over an ``LLMEngine`` in this process."""

    def __init__(self, engine: LLMEngine | Callable[[], LLMEngine]) -> None:
        """``engine``, or a factory the loop's thread calls first (the constructor waits for it, and
        raises what it raised)."""
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._started = threading.Event()
        self._stopped = False
        self._sink: OutputSink | None = None
        self._thread = threading.Thread(target=self._main, args=(engine,), name="kvserve-engine", daemon=True)
        if isinstance(engine, LLMEngine):
            self.engine = engine
        else:
            self._built: Future[LLMEngine] = Future()
            self._thread.start()
            self.engine = self._built.result()
        self.info = EngineInfo.from_engine(self.engine)

    def start(self, sink: OutputSink) -> None:
        """Start the step loop (on the thread that built the engine, if it did)."""
        self._sink = sink
        self._started.set()
        if not self._thread.is_alive():
            self._thread.start()

    def add_request(self, request: dict[str, Any]) -> None:
        """Queue the request for the loop."""
        self._send("add", request)

    def abort_request(self, request_id: str) -> None:
        """Queue the abort for the loop."""
        self._send("abort", request_id)

    def stats(self) -> EngineStats:
        """Read straight from the engine."""
        return self.engine.stats()

    def shutdown(self) -> None:
        """Stop the loop after the current step and wait for its thread."""
        self._stopped = True
        self._wake.set()
        self._started.set()  # a loop that was built but never started exits
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _send(self, command: str, payload: Any) -> None:
        self._commands.put((command, payload))
        self._wake.set()

    def _main(self, engine: LLMEngine | Callable[[], LLMEngine]) -> None:
        if not isinstance(engine, LLMEngine):
            try:
                self._built.set_result(engine())
            except BaseException as exc:  # the constructor re-raises it
                self._built.set_exception(exc)
                return
            self._started.wait()
            if self._stopped:
                return
        self._run()

    def _run(self) -> None:
        reason, error = "engine is shut down", None
        try:
            while not self._stopped:
                self._apply_commands()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait()
                    self._wake.clear()
                    continue
                outputs = self.engine.step()
                if outputs:
                    self._sink.deliver_step(outputs)
        except BaseException as exc:  # report to every waiting consumer instead of hanging them
            if isinstance(exc, EngineDeadError):
                logger.error("engine loop died: %s", exc)  # the engine logged the traceback
            else:
                logger.exception("engine loop died")
            reason, error = f"engine loop died: {exc!r}", exc
        finally:
            self._sink.close(reason, error)
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
                self._sink.deliver(payload["request_id"], exc)
