"""Admission rules of core: caps on what the running requests may hold together."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from kvserve.interfaces.scheduler import AdmissionRule
from kvserve.request import Request


class DistinctKeyLimit(AdmissionRule):
    """At most ``limit`` distinct ``key(request)`` values among the running requests, e.g. the LoRA
    adapter each request uses when a step can carry only so many adapters. A request whose key is
    None (no adapter) needs nothing and is always admitted; one whose key is already running is
    admitted however many run."""

    def __init__(self, key: Callable[[Request], Hashable | None], limit: int) -> None:
        if limit < 1:
            raise ValueError(f"DistinctKeyLimit: limit must be at least 1, got {limit}")
        self.key = key
        self.limit = limit
        self._keys: set[Hashable] = set()

    def start_step(self, running: Sequence[Request]) -> None:
        self._keys = {key for request in running if (key := self.key(request)) is not None}

    def admits(self, request: Request) -> bool:
        key = self.key(request)
        return key is None or key in self._keys or len(self._keys) < self.limit

    def admitted(self, request: Request) -> None:
        key = self.key(request)
        if key is not None:
            self._keys.add(key)
