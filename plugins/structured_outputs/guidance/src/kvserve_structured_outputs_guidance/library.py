"""The llguidance versions this backend is written for."""

from kvserve.optional_library import OptionalLibrary

# LLMatcher and its grammar_from_* / validate_grammar arrived with 1.0.
LLGUIDANCE = OptionalLibrary(
    distribution="llguidance",
    name="llguidance",
    minimum=(1, 0),
    below=(2, 0),
    install="pip install 'llguidance>=1.0,<2'",
)
