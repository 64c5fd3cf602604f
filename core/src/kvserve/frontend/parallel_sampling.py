"""``n > 1``: a front end fans a request out into ``n`` single-sample child requests and merges
their outputs back into the parent's, as vLLM v1 does (``ParentRequest``). The engine and every
scheduler see only requests of one sample each.

Child ``i`` samples with ``seed + i`` (when seeded) and only child 0 asks for prompt logprobs.
Children 1..n-1 wait for child 0's prompt (``CheckedRequest.after_prompt_of``): they are admitted
once its full blocks are in the prefix cache (in the step that computes them, at the earliest),
so they start from those blocks instead of prefilling the prompt again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from kvserve.engine.validation import CheckedRequest
from kvserve.outputs import CompletionOutput, RequestMetrics, RequestOutput


def child_request_id(request_id: str, index: int) -> str:
    """The engine's id of sample ``index`` of ``request_id`` (vLLM's form)."""
    return f"{index}_{request_id}"


class ParentRequest:
    """One ``n > 1`` request: its children (:attr:`children`, to queue in order) and the merge of
    their outputs into outputs of the parent, per the parent's ``output_kind``: ``cumulative``
    (every sample so far), ``delta`` (the new part of the samples that changed) or ``final_only``
    (all samples, once every one has finished). ``CompletionOutput.index`` is the child's index.

    Children stream deltas whatever the parent's ``output_kind``: the parent keeps every sample
    whole, so a failure reports what each sample had. A child the engine failed fails the
    parent: its output is then final, carries the error, and finishes the other samples with
    ``"abort"``; the caller aborts :meth:`unfinished_children`.
    """

    def __init__(self, request_id: str, request: CheckedRequest) -> None:
        params = request.params
        self.request_id = request_id
        self.request = request
        leader = child_request_id(request_id, 0)
        self.children: dict[str, CheckedRequest] = {}
        """Child id -> its request, child 0 (the one the others wait for) first."""
        for index in range(params.n):
            update: dict[str, Any] = {"n": 1, "output_kind": "delta"}
            if params.seed is not None:
                update["seed"] = params.seed + index
            if index:
                update["prompt_logprobs"] = None
            self.children[child_request_id(request_id, index)] = dataclasses.replace(
                request, params=params.model_copy(update=update), after_prompt_of=leader if index else None
            )
        self._index = {child_id: index for index, child_id in enumerate(self.children)}
        self._running = set(self.children)
        """The children the engine has not finished."""
        with_logprobs = params.logprobs is not None
        self._samples = [
            CompletionOutput(index, "", [], 0.0 if with_logprobs else None, [] if with_logprobs else None)
            for index in range(params.n)
        ]
        """Each sample as it stands, accumulated from its child's deltas."""
        self._metrics: list[RequestMetrics | None] = [None] * params.n
        self._prompt_logprobs: Any = None
        self.error: str | None = None
        self.invalid_request = False
        """The first child failure; the parent is finished once it is set."""

    @property
    def finished(self) -> bool:
        return self.error is not None or all(c.finish_reason is not None for c in self._samples)

    def unfinished_children(self) -> list[str]:
        """The ids of the children the engine has not finished (to abort when the parent ends early)."""
        return [child_id for child_id in self.children if child_id in self._running]

    def add(self, output: RequestOutput) -> RequestOutput | None:
        """Fold in child ``output`` (a delta); the parent's output to emit now, or None (nothing to
        emit, or the parent has already ended)."""
        index = self._index[output.request_id]
        if output.finished:
            self._running.discard(output.request_id)
        if self.finished:
            return None  # a child's output that was on its way when a sibling failed
        self._metrics[index] = output.metrics
        if index == 0 and output.prompt_logprobs is not None:
            self._prompt_logprobs = output.prompt_logprobs
        new = [dataclasses.replace(c, index=index) for c in output.outputs]
        for delta in new:
            _extend(self._samples[index], delta)
        if output.error is not None:
            self.error, self.invalid_request = output.error, output.invalid_request
            aborted = [sample for sample in self._samples if sample.finish_reason is None]
            for sample in aborted:
                sample.finish_reason = "abort"
            new += [CompletionOutput(sample.index, "", [], finish_reason="abort") for sample in aborted]
        finished = self.finished
        kind = self.request.params.output_kind
        if kind == "final_only" and not finished:
            return None
        if kind == "delta":
            outputs, prompt_logprobs = sorted(new, key=lambda c: c.index), output.prompt_logprobs
        else:
            outputs, prompt_logprobs = [_copy(sample) for sample in self._samples], self._prompt_logprobs
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.request.prompt,
            prompt_token_ids=self.request.prompt_token_ids,
            outputs=outputs,
            finished=finished,
            prompt_logprobs=prompt_logprobs,
            metrics=self._merged_metrics(finished),
            error=self.error,
            invalid_request=self.invalid_request,
        )

    def _merged_metrics(self, finished: bool) -> RequestMetrics | None:
        """The parent's milestones: the earliest of its children's, finished when the last one did."""
        known = [m for m in self._metrics if m is not None]
        if not known:
            return None

        def earliest(field: str) -> float | None:
            times = [t for m in known if (t := getattr(m, field)) is not None]
            return min(times) if times else None

        last = [m.finished_time for m in known]
        return RequestMetrics(
            arrival_time=min(m.arrival_time for m in known),
            first_scheduled_time=earliest("first_scheduled_time"),
            first_token_time=earliest("first_token_time"),
            finished_time=max(last) if finished and None not in last and len(known) == len(self._metrics) else None,
        )


def _extend(sample: CompletionOutput, delta: CompletionOutput) -> None:
    """Append ``delta``, the new part of ``sample``'s child output, to ``sample``."""
    sample.text += delta.text
    sample.token_ids.extend(delta.token_ids)
    if delta.logprobs is not None and sample.logprobs is not None:
        sample.logprobs.extend(delta.logprobs)
    sample.cumulative_logprob = delta.cumulative_logprob
    sample.finish_reason, sample.stop_reason = delta.finish_reason, delta.stop_reason


def _copy(sample: CompletionOutput) -> CompletionOutput:
    """``sample`` as it stands, apart from the lists the parent goes on extending."""
    logprobs = None if sample.logprobs is None else list(sample.logprobs)
    return dataclasses.replace(sample, token_ids=list(sample.token_ids), logprobs=logprobs)


class OutputTarget(Protocol):
    """Where a fanned-out request's merged outputs go (an ``OutputStream``)."""

    def put(self, item: RequestOutput | BaseException) -> None:
        """Hand over an output, or the exception that ends the stream."""


class ParentStream:
    """The stream every child of ``parent`` is registered under: child outputs are merged into the
    parent's and handed to ``target``; an exception (a dead engine, a refused child) goes straight on."""

    def __init__(self, parent: ParentRequest, target: OutputTarget) -> None:
        self.parent = parent
        self.target = target

    def put(self, item: RequestOutput | BaseException) -> None:
        """Take a child's output (or an exception) from the engine core."""
        if isinstance(item, BaseException):
            self.target.put(item)
            return
        merged = self.parent.add(item)
        if merged is not None:
            self.target.put(merged)
