"""One request's outputs between the engine core and its consumer, merged while the consumer lags.

As vLLM's ``RequestOutputStream``: instead of a queue that grows by one item per step, the
collector holds at most one pending output. A delta output arriving before the consumer took
the previous one is merged into it, so a slow client gets fewer, larger chunks and never makes
the server do per-token work for tokens it has not read yet; a cumulative or final output
simply supersedes the pending one. An exception ends the stream and wins over pending outputs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kvserve.outputs import RequestOutput


def merge_delta(into: RequestOutput, new: RequestOutput) -> None:
    """Append delta output ``new`` to the older, not yet consumed delta output ``into`` (modified in place)."""
    by_index = {c.index: c for c in into.outputs}
    for completion in new.outputs:
        old = by_index.get(completion.index)
        if old is None:
            into.outputs.append(completion)
            continue
        old.text += completion.text
        old.token_ids.extend(completion.token_ids)
        if completion.logprobs is not None:
            old.logprobs = (old.logprobs or []) + completion.logprobs
        old.cumulative_logprob = completion.cumulative_logprob
        old.finish_reason, old.stop_reason = completion.finish_reason, completion.stop_reason
    into.outputs.sort(key=lambda c: c.index)
    into.finished = new.finished
    if into.prompt_logprobs is None:
        into.prompt_logprobs = new.prompt_logprobs
    into.metrics = new.metrics
    if new.error is not None:
        into.error, into.invalid_request = new.error, new.invalid_request


class OutputStream:
    """The pending output (or exception) of one request; ``put`` and ``get`` run on the consumer's event loop."""

    def __init__(self, delta: bool) -> None:
        self.delta = delta
        self._pending: RequestOutput | BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, item: RequestOutput | BaseException) -> None:
        """Hand over ``item``: merged into (delta) or replacing (otherwise) a pending output."""
        pending = self._pending
        if isinstance(item, BaseException) or pending is None:
            self._pending = item
        elif isinstance(pending, RequestOutput):
            if self.delta:
                merge_delta(pending, item)
            else:
                self._pending = item
        # else an exception is pending: the stream ends with it, later outputs are moot
        self._ready.set()

    async def get(self) -> Any:
        """Wait for and take the pending output or exception."""
        while self._pending is None:
            await self._ready.wait()
        item, self._pending = self._pending, None
        self._ready.clear()
        return item
