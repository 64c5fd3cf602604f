"""The seam between ``AsyncLLM`` (the frontend) and the engine core that steps the batch.

Two clients implement it: :class:`~kvserve.frontend.thread_client.ThreadClient` (the engine on a
thread of this process) and :class:`~kvserve.frontend.process_client.ProcessClient` (the engine in
its own process behind ZeroMQ, so HTTP, tokenization and SSE never hold the step loop's GIL). Both
cores run the same step loop (:mod:`kvserve.frontend.step_loop`).
"""

from __future__ import annotations

from typing import Any, Protocol

from kvserve.engine.stats import EngineStats
from kvserve.frontend.engine_info import EngineInfo
from kvserve.outputs import RequestOutput


class OutputSink(Protocol):
    """Where a core sends what it produces; its methods may be called from any thread."""

    def deliver(self, request_id: str, item: Any) -> None:
        """Hand ``item`` (a RequestOutput, or an exception that ends the request) to ``request_id``'s stream."""

    def deliver_step(self, outputs: list[RequestOutput]) -> None:
        """Hand over one step's outputs at once (each to its request's stream), as cheaply as one call."""

    def close(self, reason: str, error: BaseException | None) -> None:
        """The core serves no more: ``reason`` goes to every waiting and later caller as EngineDeadError;
        ``error`` is what killed it (None for an orderly shutdown). Called once, last."""


class EngineCoreClient(Protocol):
    """An engine core as the frontend drives it. Requests arrive validated (``AsyncLLM`` checks them)."""

    info: EngineInfo

    def start(self, sink: OutputSink) -> None:
        """Begin stepping; outputs go to ``sink`` from now on."""

    def add_request(self, request: dict[str, Any]) -> None:
        """Queue ``LLMEngine.add_request(**request)``; its outputs (or its error) reach the sink.

        Raises ValueError, naming the field, for a request that cannot be sent to the core."""

    def abort_request(self, request_id: str) -> None:
        """Stop ``request_id`` and free its KV blocks before the next step (unknown ids are ignored)."""

    def call(self, command: tuple[Any, ...]) -> None:
        """Queue an engine command that is answered, ``("add_lora", call_id, LoRARequest)`` or
        ``("remove_lora", call_id, lora_int_id)``: the answer (None, or the exception the engine raised)
        reaches the sink as ``deliver(call_id, answer)``."""

    def stats(self) -> EngineStats:
        """The engine's counters and gauges, as of its latest step at the oldest."""

    def shutdown(self) -> None:
        """Stop after the current step and release the core's threads or processes; the sink's
        ``close`` has been called when this returns."""
