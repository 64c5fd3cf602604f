"""The DraftProposer interface: guesses of a request's next tokens, for speculative decoding.

With ``speculative_config`` set, after each step the engine asks the proposer its ``method`` names
for up to ``num_speculative_tokens`` draft tokens per decoding request. The next step computes the
request's last token and the drafts in one forward pass and verifies them in the core: a draft is
kept only while it equals the token the target model samples at its position (for greedy requests,
the argmax), and the token sampled after the last kept draft is emitted too. So a proposer can only
change how fast a request decodes, never what it emits: a proposer that guesses garbage still gives
exactly the outputs of decoding without speculation (the contract,
``kvserve.testing.DraftProposerContract``, runs the engine to check it).

Drafts are token ids only: verification treats each as certain (a point mass), which is the exact
rejection rule (Leviathan et al.) for a deterministic proposer. A proposer must therefore be
deterministic: the same tokens give the same drafts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel

if TYPE_CHECKING:
    import torch

    from kvserve.config import EngineConfig, SpeculativeConfig
    from kvserve.interfaces.platform import Platform


@dataclass(frozen=True)
class DraftRequest:
    """What a proposer sees of one request: its id and its tokens so far (read-only views of the
    engine's lists: copy what you keep)."""

    request_id: str
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    """Generated so far; the last one is the token the drafts follow."""
    hidden_states: torch.Tensor | None = None
    """For a proposer with :attr:`DraftProposer.uses_hidden_states`: the target model's final hidden
    states (the ones its logits are computed from), ``[n, hidden]`` in the model dtype on the target's
    device (the CPU under tensor parallelism), of the positions that produced the ``n`` tokens its last
    step emitted: row ``j`` is the state from which ``output_token_ids[-n + j]`` was sampled, so the
    last row is the state at the position before the last token (with that token, an EAGLE head's
    input for the first draft). ``n`` is 1 after a prefill or a plain decode step, ``1 + accepted``
    after a verification step. Only the last step's rows: a request skipped in between (above
    ``disable_by_batch_size``) arrives with the rows of its latest step alone. A view of the step's
    tensor: clone what you keep. None otherwise."""


@dataclass(frozen=True)
class TargetModel:
    """The engine a proposer drafts for, as :meth:`DraftProposer.attach` gets it: what a proposer that
    runs a model of its own (``draft_model``) builds it with."""

    config: EngineConfig
    """The engine's validated config (its platform, dtype, cache and scheduler limits)."""
    platform: Platform
    """The platform the target runs on, resolved."""
    model_path: str
    """The target model's directory or file (for messages)."""
    max_model_len: int
    """The target's longest sequence, resolved."""


class DraftProposer(ABC):
    """Proposes draft tokens for a batch of decoding requests each step.

    Built once per engine by ``cls(config, vocab_size)``: ``config`` is the engine's validated
    :class:`~kvserve.config.SpeculativeConfig` (its ``method`` is this proposer's registry name),
    ``vocab_size`` the target model's vocabulary (every draft id must be below it). A method's own
    ``speculative_config`` fields are declared by :attr:`options` and arrive validated as
    :attr:`method_options`.
    """

    name: ClassVar[str]
    """The registry name, selected by ``speculative_config["method"]``."""

    options: ClassVar[type[BaseModel] | None] = None
    """The method's own ``speculative_config`` fields (vLLM's names, e.g. ``suffix_decoding_max_tree_depth``)
    as a pydantic model with their defaults; None: it takes none. A field neither the core's
    :class:`~kvserve.config.SpeculativeConfig` nor this model declares stops the engine at start, named."""

    uses_hidden_states: ClassVar[bool] = False
    """True: the engine keeps the target's final hidden states of the positions it samples and hands
    each request's rows to :meth:`propose` as :attr:`DraftRequest.hidden_states` (EAGLE-style heads
    draft from them). They depend on the target's arithmetic, so such a proposer is deterministic only
    up to its rounding; outputs stay exact all the same (verification never trusts a draft)."""

    def __init__(self, config: SpeculativeConfig, vocab_size: int) -> None:
        """Keep the config, the vocabulary size and the method's validated fields (as :attr:`config`,
        :attr:`vocab_size` and :attr:`method_options`, None without :attr:`options`); ConfigError
        naming a field the method does not take or a bad value."""
        self.config = config
        self.vocab_size = vocab_size
        self.method_options = config.method_options(self.options)

    @abstractmethod
    def propose(self, requests: Sequence[DraftRequest], num_tokens: Sequence[int]) -> list[list[int]]:
        """Drafts for each request: ``result[i]`` guesses the tokens after the last token of
        ``requests[i]``, in order, at most ``num_tokens[i]`` of them (0 means none is wanted; an
        empty list is always allowed: nothing worth guessing). Every id is an ``int`` in
        ``[0, vocab_size)``. Deterministic: the same tokens give the same drafts, whatever else is in
        the batch. Called once per step, on the engine's thread, with the requests that decode next."""

    def attach(self, target: TargetModel) -> None:  # noqa: B027 - most proposers need nothing of the engine
        """Called once by the engine, at start, after construction: a proposer with a model of its
        own builds it here, on ``target.platform`` (ConfigError naming the field that cannot be met).
        Proposers used without an engine (unit tests) are never attached."""

    def forget(self, request_id: str) -> None:  # noqa: B027 - stateless proposers keep nothing
        """``request_id`` finished (or was aborted): drop whatever is kept for it."""
