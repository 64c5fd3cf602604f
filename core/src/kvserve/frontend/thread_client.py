"""The engine core on a dedicated thread of the frontend's process (a forward pass blocks, so the
event loop stays free for I/O; both share the GIL). Requests and aborts cross over through a
queue and are applied between steps by the step loop (:mod:`kvserve.frontend.step_loop`).

Given a factory, the engine is built on that same thread. OpenMP (torch's CPU thread pool) keeps a
pool of workers per thread that starts parallel work; once a second pool exists, libgomp counts
more threads than cores and its workers stop spin-waiting between parallel regions, so every
kernel pays a wake-up. A model loaded on the main thread and stepped on this one ran its decode
GEMMs 1.45x slower than one loaded and stepped on the same thread (2 cores, 61 GEMMs a step).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.stats import EngineStats
from kvserve.frontend.client import OutputSink
from kvserve.frontend.engine_info import EngineInfo
from kvserve.frontend.step_loop import Command, run_step_loop
from kvserve.outputs import RequestOutput


class ThreadTransport:
    """:class:`~kvserve.frontend.step_loop.CoreTransport` within one process: commands through a
    queue (an event wakes an idle loop), outputs straight into the frontend's ``OutputSink``."""

    def __init__(self) -> None:
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._wake = threading.Event()
        self.sink: OutputSink | None = None
        """Where outputs go; set before the loop starts."""

    def send(self, command: Command) -> None:
        """Queue ``command`` for the loop (from any thread) and wake it if it is idle."""
        self._commands.put(command)
        self._wake.set()

    def receive(self, wait: bool) -> list[Command]:
        """Drain the queue; when ``wait``, first sleep until a command was sent."""
        if wait:
            self._wake.wait()
            self._wake.clear()  # before draining: a command sent after the drain sets it again
        commands = []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                return commands

    def publish(self, outputs: list[RequestOutput]) -> None:
        """Deliver the step's outputs, if any (the frontend reads the stats from the engine itself)."""
        if outputs:
            self.sink.deliver_step(outputs)

    def refuse(self, request_id: str, error: Exception) -> None:
        """End ``request_id``'s stream with ``error``."""
        self.sink.deliver(request_id, error)

    def answer(self, call_id: str, result: Any) -> None:
        """Hand ``result`` to the caller waiting under ``call_id``."""
        self.sink.deliver(call_id, result)

    def end(self, reason: str, error: BaseException | None) -> None:
        """Close the sink: every stream gets EngineDeadError(``reason``)."""
        self.sink.close(reason, error)


class ThreadClient:
    """:class:`~kvserve.frontend.client.EngineCoreClient` over an ``LLMEngine`` stepped on a thread of this process."""

    def __init__(self, engine: LLMEngine | Callable[[], LLMEngine]) -> None:
        """``engine``, or a factory the loop's thread calls first (the constructor waits for it, and
        raises what it raised)."""
        self._transport = ThreadTransport()
        self._started = threading.Event()
        self._stopped = False
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
        self._transport.sink = sink
        self._started.set()
        if not self._thread.is_alive():
            self._thread.start()

    def add_request(self, request: dict[str, Any]) -> None:
        """Queue the request for the loop."""
        self._transport.send(("add", request))

    def abort_request(self, request_id: str) -> None:
        """Queue the abort for the loop."""
        self._transport.send(("abort", request_id))

    def call(self, command: Command) -> None:
        """Queue the command for the loop."""
        self._transport.send(command)

    def stats(self) -> EngineStats:
        """Read straight from the engine."""
        return self.engine.stats()

    def shutdown(self) -> None:
        """Stop the loop after the current step and wait for its thread."""
        self._stopped = True
        self._transport.send(("shutdown",))
        self._started.set()  # a loop that was built but never started exits
        if self._thread.is_alive():
            self._thread.join(timeout=30)

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
        run_step_loop(self.engine, self._transport)
