"""The engine core's step loop, one for every transport: schedule, step, publish.

The loop owns an ``LLMEngine`` and talks to the frontend only through a :class:`CoreTransport`:
the thread transport (:mod:`kvserve.frontend.thread_client`: a queue, an event and the frontend's
``OutputSink``) and the ZeroMQ one (:mod:`kvserve.frontend.engine_process`: two sockets and the wire
format). Commands are the wire's tuples, applied between steps in the order they were sent:
``("add", LLMEngine.add_request kwargs)``, ``("abort", request_id)``, ``("shutdown",)``, and the
LoRA adapter updates ``("add_lora", call_id, LoRARequest)`` and ``("remove_lora", call_id, lora_int_id)``,
answered (None, or the exception) under ``call_id``.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import Any, Protocol

from kvserve.engine.llm_engine import LLMEngine
from kvserve.errors import EngineDeadError
from kvserve.outputs import RequestOutput

logger = logging.getLogger("kvserve")

Command = tuple[Any, ...]
"""``("add", request kwargs)``, ``("abort", request_id)``, ``("shutdown",)``, ``("add_lora", call_id,
LoRARequest)`` or ``("remove_lora", call_id, lora_int_id)``."""


class CoreTransport(Protocol):
    """How the step loop hears the frontend's commands and answers it; called from the loop's thread only."""

    def receive(self, wait: bool) -> list[Command]:
        """The commands sent since the last call, oldest first.

        ``wait`` is True when the engine is idle: block until a command comes (a transport may return
        empty-handed after a while, to look around: the process transport checks that its frontend
        lives). False between steps: return at once with whatever has arrived."""

    def publish(self, outputs: list[RequestOutput]) -> None:
        """Hand one step's outputs to the frontend. Called after every step (``outputs`` may be empty)
        and with ``[]`` after commands changed the engine without a step (aborts freed blocks), so a
        transport that carries the engine's stats sends them then."""

    def refuse(self, request_id: str, error: Exception) -> None:
        """The engine refused ``("add", ...)`` for ``request_id``: its caller gets ``error``."""

    def answer(self, call_id: str, result: Any) -> None:
        """The engine applied the command ``call_id`` (``("add_lora", ...)``, ``("remove_lora", ...)``): its
        caller gets ``result``, None or the exception it raised."""

    def end(self, reason: str, error: BaseException | None) -> None:
        """The loop serves no more: every waiting and later caller gets EngineDeadError(``reason``);
        ``error`` is what killed it (None after a shutdown command). Called once, last."""


SHUT_DOWN = "engine is shut down"
"""The reason callers hear after an orderly stop."""


def run_step_loop(engine: LLMEngine, transport: CoreTransport) -> BaseException | None:
    """Step ``engine`` while it has work, applying the transport's commands between steps, until a
    shutdown command or a failed step; returns what failed (None after a shutdown).

    On the way out every request still in the engine is aborted (its blocks freed), after the
    transport has told the frontend, so no caller waits on the clean-up."""
    reason, error = SHUT_DOWN, None
    try:
        while True:
            commands = transport.receive(wait=not engine.has_unfinished_requests())
            if not _apply(engine, transport, commands):
                break
            if engine.has_unfinished_requests():
                transport.publish(engine.step())
            elif commands:  # aborts freed blocks: the stats must show it without a step
                transport.publish([])
    except BaseException as exc:  # report to every waiting caller instead of hanging them
        if isinstance(exc, EngineDeadError):
            logger.error("engine loop died: %s", exc)  # the engine logged the traceback
        else:
            logger.exception("engine loop died")
        reason, error = f"engine loop died: {exc!r}", exc
    transport.end(reason, error)
    for request_id in list(engine.states):
        with suppress(Exception):  # a dead engine may fail to abort; its callers are answered already
            engine.abort_request(request_id)
    return error


def _apply(engine: LLMEngine, transport: CoreTransport, commands: list[Command]) -> bool:
    """Apply ``commands`` in order; False at a shutdown (the commands after it are not applied)."""
    for command in commands:
        kind = command[0]
        if kind == "add":
            request = command[1]
            try:
                engine.add_request(**request)
            except Exception as exc:  # validated by the frontend; anything left still reaches its caller
                transport.refuse(request["request_id"], exc)
        elif kind == "abort":
            engine.abort_request(command[1])
        elif kind in ("add_lora", "remove_lora"):
            call_id, argument = command[1], command[2]
            try:
                (engine.load_lora if kind == "add_lora" else engine.remove_lora)(argument)
            except Exception as exc:  # a refused adapter: its caller hears why, the engine serves on
                transport.answer(call_id, exc)
            else:
                transport.answer(call_id, None)
        elif kind == "shutdown":
            return False
        else:
            raise ValueError(f"command: unknown kind {kind!r}")
    return True
