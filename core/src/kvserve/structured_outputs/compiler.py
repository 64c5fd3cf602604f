"""Grammars compiled off the step loop, cached by constraint, installed on requests when ready."""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kvserve.config import StructuredOutputsConfig
from kvserve.interfaces.reasoning_parser import ReasoningParser
from kvserve.interfaces.structured_output import StructuredOutputBackend
from kvserve.plugins import load_component
from kvserve.reasoning import constrain_after_reasoning
from kvserve.request import Request

CACHED_GRAMMARS = 256
"""Compiled grammars kept (least recently used dropped first)."""


class GrammarCompiler:
    """Compiles each constrained request's grammar on one worker thread and, between steps, gives
    the request its matcher once the grammar is ready; until then the request waits in the
    scheduler (:attr:`Request.ready_when`). Requests with an equal constraint share one compilation.

    Built by the engine with its tokenizer, the model's vocabulary size and EOS ids (see
    :class:`~kvserve.interfaces.StructuredOutputBackend`); backends are built on first use. With a
    reasoning parser, each matcher waits for the end of the request's reasoning
    (:func:`~kvserve.reasoning.constrain_after_reasoning`).
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        config: StructuredOutputsConfig,
        reasoning_parser: ReasoningParser | None = None,
    ) -> None:
        """``reasoning_parser``: the engine's; a grammar then holds only after the request's reasoning."""
        self._backend_args = (tokenizer, vocab_size, eos_token_ids, config)
        self._reasoning_parser = reasoning_parser
        self._backends: dict[str, StructuredOutputBackend] = {}
        self._compiled: OrderedDict[tuple[str, str], Future] = OrderedDict()
        self._pending: dict[str, tuple[Request, str, Future]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, request: Request, backend: str) -> None:
        """Start (or reuse) the compilation of ``request``'s constraint with ``backend``; the request is
        not ready until :meth:`install_ready` has given it its matcher."""
        key = (backend, request.sampling_params.structured_outputs.cache_key())
        future = self._compiled.get(key)
        if future is None or (future.done() and future.exception() is not None):
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvserve-grammar")
            future = self._pool.submit(self._compile, backend, request.sampling_params.structured_outputs)
            self._compiled[key] = future
            if len(self._compiled) > CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(key)
        self._pending[request.request_id] = (request, backend, future)
        waiting_for = request.ready_when
        request.ready_when = lambda: request.logits_constraint is not None and (waiting_for is None or waiting_for())

    def install_ready(self) -> dict[str, str]:
        """Give every request whose grammar has compiled its matcher. Returns the requests whose
        compilation failed: request id -> the error (the caller fails them)."""
        failed = {}
        for request_id, (request, backend, future) in list(self._pending.items()):
            if not future.done():
                continue
            del self._pending[request_id]
            try:
                matcher = self._backend(backend).matcher(future.result())
                request.logits_constraint = constrain_after_reasoning(
                    matcher, self._reasoning_parser, request.prompt_token_ids
                )
            except Exception as exc:  # the constraint (or the backend) failed: this request only
                failed[request_id] = f"compiling its structured_outputs with {backend} failed: {exc}"
        return failed

    def forget(self, request_id: str) -> None:
        """``request_id`` left the engine (finished or aborted) before its grammar was ready."""
        self._pending.pop(request_id, None)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, backend: str, params: Any) -> Any:
        return self._backend(backend).compile(params)

    def _backend(self, name: str) -> StructuredOutputBackend:
        backend = self._backends.get(name)
        if backend is None:
            backend = self._backends[name] = load_component("structured_output_backend", name)(*self._backend_args)
        return backend
