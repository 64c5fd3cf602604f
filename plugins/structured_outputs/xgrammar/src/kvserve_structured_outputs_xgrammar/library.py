"""The xgrammar versions this backend is written for."""

from kvserve.optional_library import OptionalLibrary

# 0.2 has Grammar.from_lark, the structural tag "format" form and the Earley matcher with
# unlimited rollback; a later minor version may change them.
XGRAMMAR = OptionalLibrary(
    distribution="xgrammar",
    name="xgrammar",
    minimum=(0, 2),
    below=(0, 3),
    install="pip install 'xgrammar>=0.2.9,<0.3'",
)
