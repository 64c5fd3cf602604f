"""When a sequence stops: every stop rule, in one place.

Token rules (EOS, ``stop_token_ids``, ``max_tokens``, ``max_model_len``) are applied by the
scheduler's ``update`` as it appends each sampled token (:meth:`Request.append_token`); stop
strings need the text, so the output processor applies :func:`find_stop_string` after
detokenizing, and the engine ends a request whose grammar is complete (:func:`grammar_complete`)
the same way. ``min_tokens`` is enforced by the sampler (it bans EOS and stop tokens) and here
for stop strings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvserve.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvserve.request import Request


def token_stop(request: Request, max_model_len: int) -> tuple[str, int | None] | None:
    """``("stop", stop token id, or None for EOS)``, ``("length", None)``, or None to go on,
    for ``request`` right after its latest output token was appended."""
    params, token_id = request.sampling_params, request.output_token_ids[-1]
    if is_stop_token(token_id, params, request.eos_token_ids):
        return "stop", token_id if token_id in params.stop_token_ids else None
    if len(request.output_token_ids) >= (params.max_tokens or max_model_len) or request.num_tokens >= max_model_len:
        return "length", None
    return None


def is_stop_token(token_id: int, params: SamplingParams, eos_token_ids: tuple[int, ...]) -> bool:
    """Whether ``token_id`` ends generation by itself (its text is then left out of the output,
    unless ``include_stop_str_in_output``)."""
    return token_id in params.stop_token_ids or (token_id in eos_token_ids and not params.ignore_eos)


def find_stop_string(text: str, new_from: int, request: Request) -> tuple[int, str] | None:
    """The earliest stop string in ``text`` (``request``'s output) that ends after ``new_from``
    (the text before the latest token), as ``(position, stop)``; None before ``min_tokens``."""
    params = request.sampling_params
    if not params.stop or len(request.output_token_ids) < params.min_tokens:
        return None
    window = max(0, new_from - max(len(s) for s in params.stop) + 1)  # a match may straddle the old end
    hits = [(at, s) for s in params.stop if (at := text.find(s, window)) >= 0]
    return min(hits) if hits else None


def grammar_complete(request: Request) -> bool:
    """Whether ``request``'s grammar (its logits constraint) accepts nothing more, so the request
    stops as on a stop string; False once a token rule has already stopped it (that rule wins)."""
    constraint = request.logits_constraint
    return constraint is not None and not request.status.finished and constraint.is_terminated()
