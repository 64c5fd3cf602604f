"""Entry point of kvserve-proposer-suffix."""

from kvserve import hookimpl
from kvserve.hookspecs import Register


@hookimpl
def register_proposers(register: Register) -> None:
    register("suffix", "kvserve_proposer_suffix.proposer:SuffixProposer")
