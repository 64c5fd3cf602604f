"""kvserve-structured-outputs-guidance: constrained decoding with llguidance (imported only when used)."""
