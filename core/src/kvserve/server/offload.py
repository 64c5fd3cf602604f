"""Tokenizer work for a request: on the event loop when it is short, in a worker thread when it is long."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

T = TypeVar("T")

INLINE_CHARS = 4096
"""Up to this much text (or this many token ids to decode), the work (tens to hundreds of microseconds)
runs on the event loop: a hop to a worker thread and back costs more than that, and on a busy machine
it waits for the OS to schedule the thread, which adds straight to the time to first token."""


async def tokenizer_work(size: int, work: Callable[[], T]) -> T:
    """``work()``, inline if ``size`` (characters or tokens) is at most INLINE_CHARS, else in a worker thread
    so that streams go on meanwhile."""
    if size <= INLINE_CHARS:
        return work()
    return await run_in_threadpool(work)
