"""Broken copies of core's ``ngram`` proposer, each with one bug the DraftProposer contract must catch."""

from __future__ import annotations

from kvserve.spec_decode.ngram import NgramProposer


class OneTooMany(NgramProposer):
    """Proposes one draft more than asked."""

    def propose(self, requests, num_tokens):
        return [drafts + [0] for drafts in super().propose(requests, num_tokens)]


class PastTheVocabulary(NgramProposer):
    """Guesses the id one past the vocabulary when nothing matches."""

    def propose(self, requests, num_tokens):
        return [
            d or ([self.vocab_size] if k else []) for d, k in zip(super().propose(requests, num_tokens), num_tokens)
        ]


class BatchDependent(NgramProposer):
    """Shortens its drafts when the batch is large: a request's drafts depend on its neighbours."""

    def propose(self, requests, num_tokens):
        return [d[: max(0, 8 - len(requests))] for d in super().propose(requests, num_tokens)]
