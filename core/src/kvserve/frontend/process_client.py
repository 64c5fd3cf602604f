"""The frontend's side of the engine-core process (:mod:`kvserve.frontend.engine_process`).

The core is spawned (a fresh interpreter: no forked torch or event-loop state) and talks over
two ipc:// ZeroMQ PUSH/PULL sockets in a private temporary directory. A reader thread turns its
per-step batches into stream deliveries; it also waits on the process's sentinel, so a core
that dies (a failed step, ``kill -9``, the OOM killer) ends every stream within moments.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import zmq

from kvserve.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.engine.stats import EngineStats
from kvserve.errors import EngineDeadError
from kvserve.frontend.client import OutputSink
from kvserve.frontend.engine_info import EngineInfo
from kvserve.frontend.engine_process import run_engine_process
from kvserve.frontend.step_loop import SHUT_DOWN
from kvserve.frontend.wire import decode, encode

SHUTDOWN_TIMEOUT = 30.0
"""Seconds the core gets to finish its step and exit before it is killed."""


class ProcessClient:
    """:class:`~kvserve.frontend.client.EngineCoreClient` over an engine in its own process.

    Construction spawns the process and waits until the engine is loaded; a core that fails to
    load raises its error here (a ConfigError stays a ConfigError).
    """

    def __init__(self, config: EngineConfig, setup: Callable[[LLMEngine], Any] | None = None) -> None:
        self._directory = tempfile.mkdtemp(prefix="kvserve-core-")
        command_address = f"ipc://{self._directory}/commands"
        output_address = f"ipc://{self._directory}/outputs"
        self._context = zmq.Context()
        self._commands = self._context.socket(zmq.PUSH)
        self._commands.setsockopt(zmq.SNDHWM, 0)  # a send never blocks the event loop
        self._commands.connect(command_address)
        self._outputs = self._context.socket(zmq.PULL)
        self._outputs.bind(output_address)
        self._send_lock = threading.Lock()  # zmq sockets are not thread-safe; callers come from any thread
        self._stopping = False
        self._sink: OutputSink | None = None
        self.process = multiprocessing.get_context("spawn").Process(
            target=run_engine_process,
            args=(config, command_address, output_address, os.getpid(), setup),
            name="kvserve-engine-core",
        )
        self.process.start()
        atexit.register(self._kill)  # before multiprocessing's exit hook, which would wait for it
        self._poller = zmq.Poller()
        self._poller.register(self._outputs, zmq.POLLIN)
        self._poller.register(self.process.sentinel, zmq.POLLIN)
        try:
            self.info, self._stats = self._wait_until_ready()
        except BaseException:
            self._kill()
            self._release()
            raise
        self._reader = threading.Thread(target=self._read, name="kvserve-core-reader", daemon=True)

    def _wait_until_ready(self) -> tuple[EngineInfo, EngineStats]:
        while True:
            events = dict(self._poller.poll())
            if self._outputs in events:
                message = decode(self._outputs.recv())
                if message[0] == "failed":
                    raise message[1]
                return message[1], message[2]
            if self.process.sentinel in events:
                self.process.join()
                raise EngineDeadError(
                    f"the engine core process exited with code {self.process.exitcode} while loading; see its log"
                )

    def start(self, sink: OutputSink) -> None:
        """Start the thread that delivers the core's outputs."""
        self._sink = sink
        self._reader.start()

    def add_request(self, request: dict[str, Any]) -> None:
        """Send the request; ValueError if a part of it (a lambda logits processor) cannot be pickled."""
        try:
            frame = encode(("add", request))
        except Exception as exc:
            raise ValueError(
                f"logits_processors: the request cannot be sent to the engine core process ({exc}); "
                "give module-level functions, or run the engine in the server's process (engine_process=False)"
            ) from None
        self._send(frame)

    def abort_request(self, request_id: str) -> None:
        """Send the abort."""
        self._send(encode(("abort", request_id)))

    def call(self, command: tuple[Any, ...]) -> None:
        """Send the command."""
        self._send(encode(command))

    def stats(self) -> EngineStats:
        """The snapshot that came with the core's latest step (or abort)."""
        return self._stats

    def shutdown(self) -> None:
        """Ask the core to stop, kill it if it does not within SHUTDOWN_TIMEOUT, and release the sockets."""
        if self._stopping:
            return
        self._stopping = True
        self._send(encode(("shutdown",)))
        self.process.join(timeout=SHUTDOWN_TIMEOUT)
        self._kill()
        if self._reader.ident is not None:  # it has seen the exit and closed the sink
            self._reader.join(timeout=10)
        self._release()

    def _send(self, frame: bytes) -> None:
        with self._send_lock:
            if not self._commands.closed:
                self._commands.send(frame)

    def _read(self) -> None:
        reason, error = SHUT_DOWN, None
        try:
            while True:
                events = dict(self._poller.poll())
                if self._outputs in events:
                    dead = self._handle(decode(self._outputs.recv()))
                    if dead is not None:
                        reason, error = dead
                        return
                    continue
                if self.process.sentinel in events:
                    self.process.join()
                    if not self._stopping:
                        reason = f"the engine core process died (exit code {self.process.exitcode})"
                        error = EngineDeadError(reason)
                    return
        finally:
            self._sink.close(reason, error)

    def _handle(self, message: tuple[Any, ...]) -> tuple[str, BaseException] | None:
        """Deliver one message from the core; returns the reason and the error if it says the core died."""
        kind = message[0]
        if kind == "outputs":
            self._stats = message[2]  # first: whoever sees its last output sees its blocks freed
            if message[1]:
                self._sink.deliver_step(message[1])
        elif kind in ("error", "answer"):
            self._sink.deliver(message[1], message[2])
        elif kind == "dead":
            return message[1], message[2]
        return None

    def _kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)
        atexit.unregister(self._kill)

    def _release(self) -> None:
        with self._send_lock:
            self._commands.close(linger=0)
        self._outputs.close(linger=0)
        self._context.term()
        shutil.rmtree(self._directory, ignore_errors=True)
