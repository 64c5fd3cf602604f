"""Structured outputs: constraints a request's output must match, compiled by backend plugins."""

from kvserve.structured_outputs.params import CONSTRAINT_KINDS, ConstraintKind, StructuredOutputsParams

__all__ = ["CONSTRAINT_KINDS", "ConstraintKind", "StructuredOutputsParams"]
