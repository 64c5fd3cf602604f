"""Turns sampled tokens into user-facing outputs: text, stop strings, logprobs, streaming deltas."""

from __future__ import annotations

import time
from typing import Any

from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.outputs import CompletionOutput, RequestMetrics, RequestOutput, TokenLogprobs
from kvserve.request import Request
from kvserve.stopping import find_stop_string, is_stop_token


class SequenceState:
    """A request's completion: its scheduler request, text, logprobs, what was sent."""

    def __init__(self, request: Request, tokenizer: Any) -> None:
        params = request.sampling_params
        self.request = request
        self.detokenizer = None
        if params.detokenize:
            self.detokenizer = IncrementalDetokenizer(tokenizer, params.skip_special_tokens, request.prompt_token_ids)
        self.logprobs: list[TokenLogprobs] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self.text = ""
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.sent_tokens = 0
        self.sent_text = 0
        self.changed = False

    def add_token(self, token_id: int, logprobs: TokenLogprobs | None) -> str | None:
        """Record the request's latest generated token; returns the stop string it completed, if any.

        The text of a token that stopped generation by itself (EOS, a stop token) is left out,
        as in vLLM, unless ``include_stop_str_in_output``.
        """
        self.changed = True
        if self.logprobs is not None and logprobs is not None:
            self.logprobs.append(logprobs)
            self.cumulative_logprob += logprobs[token_id].logprob
        request, params = self.request, self.request.sampling_params
        if self.detokenizer is None:
            return None
        if is_stop_token(token_id, params, request.eos_token_ids) and not params.include_stop_str_in_output:
            return None
        before = len(self.text)
        self.text += self.detokenizer.add(token_id)
        hit = find_stop_string(self.text, before, request)
        if hit is None:
            return None
        at, stop = hit
        self.text = self.text[: at + len(stop)] if params.include_stop_str_in_output else self.text[:at]
        return stop

    def finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        self.changed = True
        self.finish_reason, self.stop_reason = reason, stop_reason

    def visible_text(self) -> str:
        """Text safe to show now: while running, a tail that could still start a stop string is held back."""
        params = self.request.sampling_params
        if self.finish_reason is not None or not params.stop:
            return self.text
        hold = max(len(s) for s in params.stop) - 1
        return self.text[: max(self.sent_text, len(self.text) - hold)]

    def completion(self, delta: bool) -> CompletionOutput:
        tokens = self.request.output_token_ids
        text = self.visible_text()
        first_token, first_char = (self.sent_tokens, self.sent_text) if delta else (0, 0)
        self.sent_tokens, self.sent_text = len(tokens), len(text)
        self.changed = False
        return CompletionOutput(
            index=0,
            text=text[first_char:],
            token_ids=list(tokens[first_token:]),
            cumulative_logprob=self.cumulative_logprob,
            logprobs=None if self.logprobs is None else self.logprobs[first_token:],
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )


class RequestState:
    """A request as the user sees it: the prompt, its completion, prompt logprobs and timing.

    The engine runs one completion per request; ``n > 1`` is fanned out by the front end
    (:mod:`kvserve.frontend.parallel_sampling`).
    """

    def __init__(self, request_id: str, prompt: str | None, request: Request, tokenizer: Any) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = request.sampling_params
        self.request = request
        self.sequence = SequenceState(request, tokenizer)
        self.metrics = RequestMetrics(arrival_time=request.arrival_time)
        self.prompt_logprobs: list[TokenLogprobs | None] | None = None
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]  # the first prompt token has no context to be predicted from
        self.sent_prompt_logprobs = False
        self.error: str | None = None
        """Set when the engine failed this request."""
        self.invalid_request = False
        """The failure was the request's own parameters' doing."""

    @property
    def finished(self) -> bool:
        return self.sequence.finish_reason is not None

    def output(self) -> RequestOutput | None:
        """The output to emit now under the request's ``output_kind`` (None: nothing to emit)."""
        kind = self.params.output_kind
        finished = self.finished
        if kind == "final_only" and not finished:
            return None
        delta = kind == "delta"
        if finished and self.metrics.finished_time is None:
            self.metrics.finished_time = time.monotonic()
        prompt_logprobs = self.prompt_logprobs
        if delta and self.sent_prompt_logprobs:
            prompt_logprobs = None
        self.sent_prompt_logprobs = True
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.request.prompt_token_ids,
            outputs=[self.sequence.completion(delta)] if self.sequence.changed or not delta else [],
            finished=finished,
            prompt_logprobs=prompt_logprobs,
            metrics=self.metrics,
            error=self.error,
            invalid_request=self.invalid_request,
        )
