"""What the engines return, shaped like vLLM's outputs."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """One candidate token's log probability under the model's raw distribution."""

    logprob: float
    rank: int
    """1 for the most likely token."""
    decoded_token: str | None = None


TokenLogprobs = dict[int, Logprob]
"""For one position: the requested top-N tokens plus the token actually chosen."""


@dataclass
class RequestMetrics:
    """Monotonic timestamps (``time.monotonic()``) of one request's milestones."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class CompletionOutput:
    """One of a request's ``n`` completions."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    """Sum of the chosen tokens' logprobs (set when ``logprobs`` is requested)."""
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None
    """``"stop"`` (EOS, a stop token or a stop string), ``"length"`` or ``"abort"``."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended generation; None for EOS or length."""

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's state as the engine reports it: one entry per completion in ``outputs``.

    With ``output_kind="delta"`` each completion holds only the text and tokens new since the
    previous output for that request (and only changed completions are included).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    metrics: RequestMetrics | None = None
    error: str | None = None
    """Why the engine failed this request (its completions then finish with ``"abort"``); None if it did not."""
    invalid_request: bool = False
    """With ``error``: the request's own parameters caused it (they rule out every token, its grammar does
    not compile) — a client error, not the engine's."""

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)
