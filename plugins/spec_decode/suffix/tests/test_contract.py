"""kvserve-proposer-suffix passes the DraftProposer contract."""

from kvserve.testing import DraftProposerContract


class TestSuffixProposer(DraftProposerContract):
    """With the global cache on (its default): the contract's engine runs fill it as requests finish."""

    proposer = "suffix"
    speculative_fields = {"suffix_decoding_max_tree_depth": 12, "suffix_decoding_min_token_prob": 0.05}
