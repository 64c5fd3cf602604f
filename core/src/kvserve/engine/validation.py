"""Checks at the door: a request the engine could never serve is refused before it is queued.

A front end (``LLM``, ``AsyncLLM``, the server) checks each prompt once and hands the engine the
:class:`CheckedRequest` it gets back; the engine takes it as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvserve.config import StructuredOutputsConfig
from kvserve.errors import CapacityError
from kvserve.interfaces.logits_processor import LogitsProcessor
from kvserve.lora.request import LoRARequest
from kvserve.sampling import bad_word_token_ids
from kvserve.sampling_params import SamplingParams
from kvserve.structured_outputs.selection import choose_backend


@dataclass(frozen=True)
class CheckedRequest:
    """A request :func:`check_request` accepted: what ``LLMEngine.add_request`` queues (picklable,
    for an engine core in its own process)."""

    prompt_token_ids: list[int]
    params: SamplingParams
    bad_words_token_ids: list[list[int]]
    """``params.bad_words`` as token sequences, tokenized and checked once."""
    priority: int = 0
    """Lower is more urgent (as in vLLM), for priority scheduling policies."""
    cache_salt: str | None = None
    """Keeps the request's prefix-cache entries apart from other tenants'."""
    prompt: str | None = None
    """The prompt's text, when it was given as text (reported back in the outputs)."""
    after_prompt_of: str | None = None
    """The id of a request whose prompt this one shares: it is admitted once that prompt's full
    blocks are in the prefix cache (computed, or computing in the same step) or computed (the
    later samples of an ``n > 1`` request wait so for the first one's); None: admitted as soon as
    the scheduler can."""
    structured_output_backend: str | None = None
    """The registered backend that compiles ``params.structured_outputs`` (None: unconstrained)."""
    lora_request: LoRARequest | None = None
    """The LoRA adapter the request runs with (None: the base model)."""


def check_request(
    prompt_token_ids: list[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    max_model_len: int,
    max_n: int,
    tokenizer: Any,
    logits_processors: Sequence[type[LogitsProcessor]] = (),
    structured_outputs: StructuredOutputsConfig | None = None,
    prompt: str | None = None,
    priority: int = 0,
    cache_salt: str | None = None,
    lora_request: LoRARequest | None = None,
    enable_lora: bool = False,
) -> CheckedRequest:
    """Raise naming the field if the request can never run; otherwise the request, checked.

    ValueError: an empty prompt; a token id outside ``[0, vocab_size)`` in the prompt,
    ``stop_token_ids``, ``allowed_token_ids``, ``logit_bias`` or the tokenized ``bad_words``;
    ``n`` above ``max_n``. CapacityError: prompt + ``max_tokens`` beyond ``max_model_len``.
    The prompt's ids are checked as numbers only: nothing decodes them. Each of the engine's batch-level
    ``logits_processors`` validates the params too (its ValueError names the field). A
    ``params.structured_outputs`` constraint no backend of ``structured_outputs`` (the engine's
    config) accepts: ValueError with the compiler's message; one that is accepted records its backend.
    A ``lora_request`` for an engine without ``enable_lora``: ValueError (the adapter itself is read
    and checked by the engine, where it runs).
    """
    if lora_request is not None and not enable_lora:
        raise ValueError(
            f"lora_request: adapter {lora_request.lora_name!r} asked of an engine started without LoRA; "
            "start it with enable_lora=True"
        )
    if not prompt_token_ids:
        raise ValueError("prompt: empty prompt")
    _check_token_ids("prompt_token_ids", prompt_token_ids, vocab_size)
    _check_token_ids("stop_token_ids", params.stop_token_ids, vocab_size)
    _check_token_ids("allowed_token_ids", params.allowed_token_ids or [], vocab_size)
    _check_token_ids("logit_bias", list(params.logit_bias), vocab_size)
    if params.n > max_n:
        raise ValueError(f"n: {params.n} completions exceed max_n={max_n}")
    needed = len(prompt_token_ids) + (params.max_tokens or 1)
    if len(prompt_token_ids) >= max_model_len or needed > max_model_len and params.max_tokens:
        raise CapacityError(
            f"max_tokens: prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) "
            f"exceeds max_model_len={max_model_len}"
        )
    for processor in logits_processors:
        processor.validate_params(params)
    bad_words = bad_word_token_ids(params.bad_words, tokenizer)
    _check_token_ids("bad_words", [t for word in bad_words for t in word], vocab_size)
    backend = None
    if params.structured_outputs is not None:
        backend = choose_backend(params.structured_outputs, structured_outputs or StructuredOutputsConfig())
    return CheckedRequest(
        list(prompt_token_ids), params, bad_words, priority, cache_salt, prompt,
        structured_output_backend=backend, lora_request=lora_request,
    )  # fmt: skip


def _check_token_ids(field: str, token_ids: list[int], vocab_size: int) -> None:
    bad = [t for t in token_ids if not (isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size)]
    if bad:
        raise ValueError(f"{field}: token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
