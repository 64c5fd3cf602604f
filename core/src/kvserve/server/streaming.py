"""Async plumbing between engine streams and HTTP: merging, disconnect watching, server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from kvserve.server.errors import OpenAIError, as_openai_error

T = TypeVar("T")

_DONE = object()


async def merge_streams(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of all ``streams`` as they come, tagged with the stream's index.

    Leaving early (or an error in any stream) cancels every stream, so each one's cleanup
    (an engine abort) runs before this generator is done.
    """
    if len(streams) == 1:  # the common case needs no tasks
        async with contextlib.aclosing(streams[0]) as only:
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for item in stream:
                    await queue.put((index, item))
        except Exception as exc:  # handed to the consumer, which re-raises it
            await queue.put((index, exc))
        await queue.put((index, _DONE))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client goes away first (the body must be read already).

    Streaming responses get this from Starlette; a non-streamed request would otherwise keep
    generating for nobody. A disconnect raises a 499 error that no one will receive.
    """

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        raise OpenAIError(499, "the client closed the request", code="client_disconnected")
    return task.result()


def sse_event(data: BaseModel | dict[str, Any] | str) -> str:
    """One server-sent event: ``data: <json>`` and a blank line."""
    if isinstance(data, BaseModel):
        data = data.model_dump_json()
    elif isinstance(data, dict):
        data = json.dumps(data)
    return f"data: {data}\n\n"


SSE_DONE = sse_event("[DONE]")


async def guarded_events(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """``events``, then ``data: [DONE]``; an error after the 200 went out becomes an error event."""
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                yield event
    except Exception as exc:
        yield sse_event(as_openai_error(exc).body())
    yield SSE_DONE


class EventStreamResponse(StreamingResponse):
    """An SSE response that closes its events and runs ``on_close`` however it ends: finished,
    disconnected, or never started."""

    def __init__(self, events: AsyncGenerator[str, None], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.events = events
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # A disconnect can cancel the response between two events; close them now (aborting the
            # engine request) rather than whenever the generator is garbage collected.
            await self.events.aclose()
            self.on_close()
