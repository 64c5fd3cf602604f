"""The engine-core process: the scheduler, KV manager and executor step loop, fed over ZeroMQ.

``ProcessClient`` (the frontend) spawns it with :func:`run_engine_process`. It binds the command
socket and connects the output socket (each sender connects, so nothing sent early is lost),
loads the engine, says ``ready`` (or ``failed``), then runs the step loop
(:mod:`kvserve.frontend.step_loop`) over :class:`SocketTransport`. It stops on ``shutdown``, when
a step fails (after saying ``dead``), and when its parent (the frontend) is gone, so a killed
server leaves no orphan behind.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import zmq

from kvserve.config import EngineConfig
from kvserve.engine.llm_engine import LLMEngine
from kvserve.frontend.engine_info import EngineInfo
from kvserve.frontend.step_loop import Command, run_step_loop
from kvserve.frontend.wire import decode, encode, portable_error
from kvserve.outputs import RequestOutput

logger = logging.getLogger("kvserve")

IDLE_POLL_MS = 500
"""How often an idle core looks for its parent: the bound on an orphan's life."""
FLUSH_MS = 2000
"""How long the last messages (``dead``) may take to leave on exit."""


def run_engine_process(
    config: EngineConfig,
    command_address: str,
    output_address: str,
    parent_pid: int,
    setup: Callable[[LLMEngine], Any] | None = None,
) -> None:
    """The process's entry point. ``setup`` (picklable) runs on the loaded engine before it serves:
    instrumentation, such as the fault injection of the tests. Exits 1 after a failed step, else 0."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the frontend decides
    context = zmq.Context()
    commands = context.socket(zmq.PULL)
    commands.bind(command_address)
    outputs = context.socket(zmq.PUSH)
    outputs.setsockopt(zmq.SNDHWM, 0)  # never block a step on a slow frontend
    outputs.connect(output_address)
    failed: list[bool] = [True]
    try:
        try:
            engine = LLMEngine(config)
            if setup is not None:
                setup(engine)
        except BaseException as exc:
            logger.exception("the engine core failed to start")
            outputs.send(encode(("failed", portable_error(exc))))
        else:
            outputs.send(encode(("ready", EngineInfo.from_engine(engine), engine.stats())))
            # Loaded on this thread, stepped on another, exactly as the thread client does. Measured (2 busy
            # cores, CPU torch): steps from the thread that started torch's OpenMP pool ran 8-40x slower
            # than from any other thread (that team spins at every op).
            transport = SocketTransport(engine, commands, outputs, parent_pid)

            def serve() -> None:
                try:
                    failed[0] = run_step_loop(engine, transport) is not None
                finally:
                    engine.shutdown()

            worker = threading.Thread(target=serve, name="kvserve-engine-core")
            worker.start()
            worker.join()
    finally:
        commands.close(linger=0)
        outputs.close(linger=FLUSH_MS)
        context.term()
    sys.exit(1 if failed[0] else 0)


class SocketTransport:
    """:class:`~kvserve.frontend.step_loop.CoreTransport` over the process's two ZeroMQ sockets, in
    :mod:`kvserve.frontend.wire`'s messages; every outputs message carries the engine's stats."""

    def __init__(self, engine: LLMEngine, commands: zmq.Socket, outputs: zmq.Socket, parent_pid: int) -> None:
        self.engine = engine
        self.commands = commands
        self.outputs = outputs
        self.parent_pid = parent_pid

    def receive(self, wait: bool) -> list[Command]:
        """Every queued command, waiting up to IDLE_POLL_MS for the first when ``wait``; a shutdown
        once the parent is gone (the frontend was killed: nobody is left to ask for one)."""
        if os.getppid() != self.parent_pid:
            logger.error("the frontend (pid %d) is gone; the engine core stops", self.parent_pid)
            return [("shutdown",)]
        if not self.commands.poll(IDLE_POLL_MS if wait else 0):
            return []
        received = []
        while True:
            try:
                received.append(decode(self.commands.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return received

    def publish(self, outputs: list[RequestOutput]) -> None:
        """Send the step's outputs with the engine's stats as of now."""
        self.outputs.send(encode(("outputs", outputs, self.engine.stats())))

    def refuse(self, request_id: str, error: Exception) -> None:
        """Send ``error`` (as :func:`~kvserve.frontend.wire.portable_error`) for ``request_id``'s caller."""
        self.outputs.send(encode(("error", request_id, portable_error(error))))

    def answer(self, call_id: str, result: Any) -> None:
        """Send ``result`` (an exception as :func:`~kvserve.frontend.wire.portable_error`) for ``call_id``'s caller."""
        if isinstance(result, BaseException):
            result = portable_error(result)
        self.outputs.send(encode(("answer", call_id, result)))

    def end(self, reason: str, error: BaseException | None) -> None:
        """Say ``dead`` after a failed step; after a shutdown the process's exit says it all."""
        if error is not None:
            self.outputs.send(encode(("dead", reason, portable_error(error))))
