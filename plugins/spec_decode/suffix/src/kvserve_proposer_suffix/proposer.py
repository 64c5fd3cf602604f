"""The ``suffix`` proposer: suffix decoding (Arctic Inference; vLLM's ``method: suffix``).

Each request has a suffix trie of its prompt and output, extended as tokens are accepted; a global
one holds the outputs of the last ``suffix_decoding_max_cached_requests`` finished requests (agents
and repeated tasks produce the same text again). The longest suffix of the request's tokens found
in a trie is followed along its most frequent continuation, for at most
``suffix_decoding_max_spec_factor`` x the match's length tokens and while the continuation's
frequency share (the product along the way) stays at least ``suffix_decoding_min_token_prob``: long
matches of repeated text draft far, short or ambiguous ones little or nothing. Of the two tries'
drafts the one with the higher expected number of accepted tokens is proposed.

Unlike Arctic's, the global trie takes a request's output when it finishes, not as it grows: drafts
then depend on the request's tokens and on finished requests only, never on the rest of the batch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat

from kvserve.config import SpeculativeConfig
from kvserve.interfaces.proposer import DraftProposer, DraftRequest
from kvserve_proposer_suffix.trie import SuffixTrie


class SuffixOptions(BaseModel):
    """The ``suffix`` method's ``speculative_config`` fields, with vLLM's names and defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    suffix_decoding_max_tree_depth: int = Field(
        24, ge=2, description="Longest run of tokens the tries hold: bounds both the match and the draft"
    )
    suffix_decoding_max_cached_requests: NonNegativeInt = Field(
        10000, description="Finished requests whose outputs the global trie keeps (oldest out first); 0: none"
    )
    suffix_decoding_max_spec_factor: PositiveFloat = Field(
        1.0, description="Drafts are at most this many times the matched suffix's length"
    )
    suffix_decoding_min_token_prob: float = Field(
        0.1, ge=0.0, le=1.0, description="Stop drafting once the continuation's frequency share falls below this"
    )


class _Request:
    """A request's trie, its prompt's tail and its output as far as the trie holds them."""

    __slots__ = ("trie", "prompt_size", "prompt_tail", "output")

    def __init__(self, prompt: Sequence[int], max_depth: int) -> None:
        self.trie = SuffixTrie(max_depth)
        self.trie.extend(prompt)
        self.prompt_size = len(prompt)
        self.prompt_tail = list(prompt[-max_depth:])
        self.output: list[int] = []


class SuffixProposer(DraftProposer):
    """Per-request tries of prompt and output, and a global trie of finished requests' outputs."""

    name = "suffix"
    options = SuffixOptions

    def __init__(self, config: SpeculativeConfig, vocab_size: int) -> None:
        super().__init__(config, vocab_size)
        o: SuffixOptions = self.method_options
        self.max_depth = o.suffix_decoding_max_tree_depth
        self.max_cached = o.suffix_decoding_max_cached_requests
        self.spec_factor = o.suffix_decoding_max_spec_factor
        self.min_token_prob = o.suffix_decoding_min_token_prob
        self.requests: dict[str, _Request] = {}
        self.global_trie = SuffixTrie(self.max_depth)
        self.cached: OrderedDict[str, list[int]] = OrderedDict()
        """Outputs in the global trie, oldest first."""

    def propose(self, requests: Sequence[DraftRequest], num_tokens: Sequence[int]) -> list[list[int]]:
        return [self._propose_one(r, k) if k > 0 else [] for r, k in zip(requests, num_tokens, strict=True)]

    def forget(self, request_id: str) -> None:
        state = self.requests.pop(request_id, None)
        if state is None or self.max_cached == 0:
            return
        # The output as the proposer last saw it (the finished request's last token may be missing).
        output = state.output
        if request_id in self.cached:
            self.global_trie.remove(self.cached.pop(request_id))
        self.global_trie.extend(output)
        self.global_trie.end_sequence()
        self.cached[request_id] = output
        while len(self.cached) > self.max_cached:
            self.global_trie.remove(self.cached.popitem(last=False)[1])

    def _propose_one(self, request: DraftRequest, k: int) -> list[int]:
        state = self._state(request)
        best: list[int] = []
        best_score = 0.0
        # The request's own trie holds its tokens as its current sequence: the match is at hand.
        matches = [(state.trie, *state.trie.longest_open_match())]
        if self.global_trie.num_nodes:
            # The request's last max_depth tokens: no longer suffix can match.
            context = (state.prompt_tail + state.output[-self.max_depth :])[-self.max_depth :]
            matches.append((self.global_trie, *self.global_trie.longest_match(context)))
        for trie, node, length in matches:
            if length == 0:
                continue
            limit = min(k, int(self.spec_factor * length))
            tokens, score = trie.draft(node, limit, self.min_token_prob)
            if score > best_score:  # ties: the request's own trie, asked first
                best, best_score = tokens, score
        return best

    def _state(self, request: DraftRequest) -> _Request:
        """The request's state, its trie brought up to its tokens (only the new ones are added: a
        preempted and recomputed request has the same tokens, so the trie stays valid)."""
        prompt, output = request.prompt_token_ids, request.output_token_ids
        state = self.requests.get(request.request_id)
        if state is None or len(state.output) > len(output) or state.prompt_size != len(prompt):
            state = self.requests[request.request_id] = _Request(prompt, self.max_depth)
        new = output[len(state.output) :]
        state.trie.extend(new)
        state.output.extend(new)
        return state
