"""The engine-core process: the scheduler, KV manager and executor step loop, fed over ZeroMQ.

``ProcessCore`` (the frontend) spawns it with :func:`run_engine_core`. It binds the command
socket and connects the output socket (each sender connects, so nothing sent early is lost),
loads the engine, says ``ready`` (or ``failed``), then steps while there is work and drains
the commands between steps. It stops on ``shutdown``, when a step fails (after saying ``dead``),
and when its parent (the frontend) is gone, so a killed server leaves no orphan behind.
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
from kvserve.engine.core_wire import decode, encode, portable_error
from kvserve.engine.engine_info import EngineInfo
from kvserve.engine.llm_engine import LLMEngine
from kvserve.errors import EngineDeadError

logger = logging.getLogger("kvserve")

IDLE_POLL_MS = 500
"""How often an idle core looks for its parent: the bound on an orphan's life."""
FLUSH_MS = 2000
"""How long the last messages (``dead``) may take to leave on exit."""


def run_engine_core(
    config: EngineConfig,
    command_address: str,
    output_address: str,
    parent_pid: int,
    setup: Callable[[LLMEngine], Any] | None = None,
) -> None:
    """The process's entry point. ``setup`` (picklable) runs on the loaded engine before it serves:
    instrumentation, such as the fault injection of the tests."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the frontend decides
    context = zmq.Context()
    commands = context.socket(zmq.PULL)
    commands.bind(command_address)
    outputs = context.socket(zmq.PUSH)
    outputs.setsockopt(zmq.SNDHWM, 0)  # never block a step on a slow frontend
    outputs.connect(output_address)
    code: list[int] = [1]
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
            # Loaded on this thread, stepped on another, exactly as the thread core does. Measured (2 busy
            # cores, CPU torch): steps from the thread that started torch's OpenMP pool ran 8-40x slower
            # than from any other thread (that team spins at every op).
            loop = CoreLoop(engine, commands, outputs, parent_pid)
            worker = threading.Thread(target=lambda: code.__setitem__(0, loop.run()), name="kvserve-engine-core")
            worker.start()
            worker.join()
    finally:
        commands.close(linger=0)
        outputs.close(linger=FLUSH_MS)
        context.term()
    sys.exit(code[0])


class CoreLoop:
    """Steps ``engine`` while it has work; applies the frontend's commands between steps."""

    def __init__(self, engine: LLMEngine, commands: zmq.Socket, outputs: zmq.Socket, parent_pid: int) -> None:
        self.engine = engine
        self.commands = commands
        self.outputs = outputs
        self.parent_pid = parent_pid
        self.stopping = False

    def run(self) -> int:
        """Serve until shutdown (0), the parent's death (0) or a failed step (1)."""
        try:
            while not self.stopping:
                if os.getppid() != self.parent_pid:
                    logger.error("the frontend (pid %d) is gone; the engine core stops", self.parent_pid)
                    return 0
                busy = self.engine.has_unfinished_requests()
                changed = self._receive(0 if busy else IDLE_POLL_MS)
                if self.stopping:
                    break
                if self.engine.has_unfinished_requests():
                    self._send_outputs(self.engine.step())
                elif changed:  # aborts freed blocks: /metrics must see it without a step
                    self._send_outputs([])
        except BaseException as exc:  # every caller hears of it from the frontend
            if isinstance(exc, EngineDeadError):
                logger.error("engine core loop died: %s", exc)  # the engine logged the traceback
            else:
                logger.exception("engine core loop died")
            self.outputs.send(encode(("dead", repr(exc))))
            return 1
        finally:
            self.engine.shutdown()
        return 0

    def _receive(self, timeout_ms: int) -> bool:
        """Apply every queued command, waiting up to ``timeout_ms`` for the first; whether any came."""
        if not self.commands.poll(timeout_ms):
            return False
        while True:
            try:
                message = decode(self.commands.recv(zmq.NOBLOCK))
            except zmq.Again:
                return True
            self._apply(message)

    def _apply(self, message: tuple[Any, ...]) -> None:
        command = message[0]
        if command == "add":
            request = message[1]
            try:
                self.engine.add_request(**request)
            except Exception as exc:  # validated by the frontend; anything left still reaches its caller
                self.outputs.send(encode(("error", request["request_id"], portable_error(exc))))
        elif command == "abort":
            self.engine.abort_request(message[1])
        elif command == "shutdown":
            self.stopping = True

    def _send_outputs(self, outputs: list) -> None:
        self.outputs.send(encode(("outputs", outputs, self.engine.stats())))
