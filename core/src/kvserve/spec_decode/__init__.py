"""Speculative decoding: draft proposers (the ``proposer`` plugin kind, ``ngram`` built in) and the
core's exact verification of their drafts."""
