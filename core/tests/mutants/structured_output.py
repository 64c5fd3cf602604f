"""Deliberately broken copies of the xgrammar structured-output backend: each breaks one rule of the contract.

Test fixtures for ``core/tests/test_structured_output_contract_mutants.py``, which asserts that the
structured-output backend contract fails each of them with a message naming the broken behaviour.
"""

from __future__ import annotations

from kvserve.interfaces.logits_constraint import LogitsConstraint
from kvserve_structured_outputs_xgrammar.backend import XgrammarBackend, XgrammarMatcher


class _Unmasked(XgrammarMatcher):
    """Fills a row of all ones."""

    def fill_bitmask(self, bitmask, row):
        bitmask[row] = -1


class SkipsTheMask(XgrammarBackend):
    """Its matchers allow every token (a row of all ones), whatever the grammar says."""

    name = "xgrammar_skips_the_mask"

    def matcher(self, compiled) -> LogitsConstraint:
        return _Unmasked(super().matcher(compiled)._matcher)


class _EndsNever(XgrammarMatcher):
    """Clears the EOS bits of xgrammar's mask and never reports itself terminated."""

    def __init__(self, matcher, eos_token_ids):
        super().__init__(matcher)
        self._eos = list(eos_token_ids)

    def fill_bitmask(self, bitmask, row):
        super().fill_bitmask(bitmask, row)
        for eos in self._eos:
            bitmask[row, eos // 32] &= ~(1 << (eos % 32))

    def is_terminated(self):
        return False


class IgnoresEos(XgrammarBackend):
    """Its matchers never allow an EOS id and never terminate."""

    name = "xgrammar_ignores_eos"

    def __init__(self, tokenizer, vocab_size, eos_token_ids, config):
        super().__init__(tokenizer, vocab_size, eos_token_ids, config)
        self.eos_token_ids = eos_token_ids

    def matcher(self, compiled) -> LogitsConstraint:
        return _EndsNever(super().matcher(compiled)._matcher, self.eos_token_ids)
