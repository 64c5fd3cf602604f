"""The engine core on a dedicated thread of the frontend's process (a forward pass blocks, so the
event loop stays free for I/O; both share the GIL). Requests and aborts cross over through a
queue and are applied between steps."""

from __future__ import annotations

import logging
import queue
import threading
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

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.info = EngineInfo.from_engine(engine)
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopped = False
        self._sink: OutputSink | None = None
        self._thread = threading.Thread(target=self._run, name="kvserve-engine", daemon=True)

    def start(self, sink: OutputSink) -> None:
        """Start the step loop's thread."""
        self._sink = sink
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
        self._thread.join(timeout=30)

    def _send(self, command: str, payload: Any) -> None:
        self._commands.put((command, payload))
        self._wake.set()

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
