"""The StructuredOutputBackend interface: compiles requests' constraints into grammars.

A backend (xgrammar, llguidance, ...) turns a :class:`~kvserve.structured_outputs.StructuredOutputsParams`
into a compiled grammar once, and each request that uses it gets its own matcher, a
:class:`~kvserve.interfaces.LogitsConstraint` the sampler's mask stage drives. Core does the rest:
choosing the backend (``auto`` falls back per request), compiling on a worker thread while the
request waits in the scheduler, caching compiled grammars by the constraint, and stopping a
request whose grammar has ended.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from kvserve.config import StructuredOutputsConfig
    from kvserve.interfaces.logits_constraint import LogitsConstraint
    from kvserve.sampling_params import StructuredOutputsParams


class StructuredOutputBackend(ABC):
    """Compiles constraints for one tokenizer and makes per-request matchers. Device-neutral: the
    matchers fill host bitmasks; the sampler applies them on the logits' device.

    Built once per engine (on the driver, where sampling runs) by
    ``cls(tokenizer, vocab_size, eos_token_ids, config)``:

    - ``tokenizer``: the engine's HF tokenizer (``PreTrainedTokenizerFast``);
    - ``vocab_size``: the model's logits width, which may exceed the tokenizer's (padding ids are never allowed);
    - ``eos_token_ids``: every id that ends generation; a matcher allows them exactly where the
      grammar may end, and accepting one terminates it;
    - ``config``: the engine's ``structured_outputs_config`` (``disable_any_whitespace``,
      ``disable_additional_properties``; a request's own settings override them).

    :meth:`compile` runs on a worker thread (one at a time per backend instance), never on the step
    loop; :meth:`matcher` and every matcher method run on the step loop and must be quick.
    """

    name: ClassVar[str]
    """The registry name (``structured_outputs_config.backend``)."""

    @classmethod
    @abstractmethod
    def validate(cls, params: StructuredOutputsParams, config: StructuredOutputsConfig) -> None:
        """Raise ValueError naming the problem (the compiler's own message) if this backend cannot
        compile ``params``: malformed schema, regex or grammar, or a feature it does not support.

        Called by the front end before the request is queued, without a tokenizer, so it must be
        cheap (parse, no token-level compilation). Passing it means :meth:`compile` should succeed.
        """

    @abstractmethod
    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar of ``params`` (opaque to core; cached and shared by every request with
        an equal :meth:`~kvserve.structured_outputs.StructuredOutputsParams.cache_key`). May take
        seconds; raises ValueError naming the problem."""

    @abstractmethod
    def matcher(self, compiled: Any) -> LogitsConstraint:
        """A fresh matcher for one request, at the start of ``compiled``'s grammar."""
