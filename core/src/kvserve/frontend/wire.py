"""What crosses the ZeroMQ sockets between the frontend and the engine-core process, and how.

Messages are tuples whose first item names them, pickled (protocol 5): a step's batch of
``RequestOutput`` dataclasses pickles in tens of microseconds, and pickle carries the
SamplingParams, exceptions and tokenizer as they are (msgspec would need every type mirrored).

Frontend to core: ``("add", request kwargs)``, ``("abort", request_id)``, ``("shutdown",)``,
``("add_lora", call_id, LoRARequest)``, ``("remove_lora", call_id, lora_int_id)``.
Core to frontend: ``("ready", EngineInfo, EngineStats)`` once loaded, or ``("failed", exception)``;
then ``("outputs", [RequestOutput], EngineStats)`` per step (or after aborts changed the stats),
``("error", request_id, exception)`` for a request the engine refused, ``("answer", call_id, None or
exception)`` for a LoRA update, and ``("dead", reason,
exception)`` when a step failed and the core stops.
"""

from __future__ import annotations

import pickle
from typing import Any


def encode(message: tuple[Any, ...]) -> bytes:
    """``message`` as one frame."""
    return pickle.dumps(message, protocol=5)


def decode(frame: bytes) -> tuple[Any, ...]:
    """The message ``frame`` carries."""
    return pickle.loads(frame)


def portable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives a pickle round trip (its type and message reach the frontend), else a
    RuntimeError with its type and message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc
