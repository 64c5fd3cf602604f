"""Deliberately broken copies of the paged KV cache manager: each breaks one rule of the contract.

Test fixtures for ``core/tests/test_contract_mutants.py``, which asserts that the KV cache
manager contract fails each of them with a message naming the broken behaviour.
"""

from __future__ import annotations

from kvserve.kv_cache.paged import PagedKVCacheManager


class TruncateKeepsBlocks(PagedKVCacheManager):
    """``truncate`` offers the accepted drafts' blocks but keeps the rejected drafts' slots."""

    name = "paged_truncate_keeps_blocks"

    def truncate(self, request, num_tokens):
        self._register_full_blocks(request, min(request.num_computed_tokens, request.num_tokens))


class OffersUncomputedToken(PagedKVCacheManager):
    """``truncate`` offers every full block of known tokens, the one holding the token sampled
    after the accepted drafts included, whose KV the next step has yet to compute."""

    name = "paged_offers_uncomputed_token"

    def truncate(self, request, num_tokens):
        super().truncate(request, num_tokens)
        self._register_full_blocks(request, request.num_tokens)
