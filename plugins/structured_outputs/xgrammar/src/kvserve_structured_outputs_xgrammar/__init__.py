"""kvserve-structured-outputs-xgrammar: constrained decoding with xgrammar (imported only when used)."""
