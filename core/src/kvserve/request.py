"""A request's state inside the engine."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvserve.sampling_params import SamplingParams
from kvserve.stopping import token_stop

if TYPE_CHECKING:
    from kvserve.interfaces.logits_constraint import LogitsConstraint
    from kvserve.lora.request import LoRARequest


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self.name.startswith("FINISHED")

    @property
    def finish_reason(self) -> str | None:
        return {"FINISHED_STOPPED": "stop", "FINISHED_LENGTH": "length", "FINISHED_ABORTED": "abort"}.get(self.name)


@dataclass(eq=False)
class Request:
    """Prompt and generated tokens, how many have KV computed, and the lifecycle status.

    After a recompute preemption ``num_computed_tokens`` drops to 0 and the prompt plus the
    tokens generated so far are prefilled again, so greedy output is unchanged.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0
    """Lower is more urgent (as in vLLM), for priority scheduling policies."""
    cache_salt: str | None = None
    """Separates prefix caches: blocks are reused only between requests with the same salt."""
    lora_request: LoRARequest | None = None
    """The LoRA adapter the request runs with (None: the base model); its KV is its own, as with a salt."""
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | None = None
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    """``sampling_params.bad_words`` as token sequences (tokenized and checked once, by the front end)."""
    logits_constraint: LogitsConstraint | None = None
    """What the request may emit next (a grammar), advanced with every accepted token; None: anything."""
    draft_token_ids: list[int] = field(default_factory=list)
    """Guesses of the tokens after the last one (speculative decoding), set by a proposer between
    steps. The next ``schedule()`` that computes this request's last token consumes them: it
    verifies as many as fit in that step (see ``ScheduledRequest.draft_token_ids``) and drops the
    rest; preemption drops them too. They are never part of :meth:`token_ids` until accepted."""
    ready_when: Callable[[], bool] | None = None
    """None: ready to run. Otherwise the scheduler admits the request only once this returns True
    (e.g. its grammar has finished compiling), then clears it; asked each step it could be admitted."""

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def is_ready(self) -> bool:
        """Whether the request may be admitted now (see :attr:`ready_when`); True once, True for good."""
        if self.ready_when is not None and self.ready_when():
            self.ready_when = None
        return self.ready_when is None

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens ``start:end`` of prompt + output."""
        prompt_len = len(self.prompt_token_ids)
        if end <= prompt_len:
            return self.prompt_token_ids[start:end]
        if start >= prompt_len:
            return self.output_token_ids[start - prompt_len : end - prompt_len]
        return (self.prompt_token_ids + self.output_token_ids)[start:end]

    def append_token(self, token_id: int, max_model_len: int) -> None:
        """Add a sampled token and finish the request if a token stop rule holds (see kvserve.stopping)."""
        self.output_token_ids.append(token_id)
        stop = token_stop(self, max_model_len)
        if stop is not None:
            reason, self.stop_reason = stop
            self.status = RequestStatus.FINISHED_STOPPED if reason == "stop" else RequestStatus.FINISHED_LENGTH
