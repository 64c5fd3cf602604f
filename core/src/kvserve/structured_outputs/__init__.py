"""Structured outputs: a request's constraint (:class:`~kvserve.sampling_params.StructuredOutputsParams`)
chosen a backend at the door (:mod:`.selection`) and compiled off the step loop (:mod:`.compiler`)."""

from kvserve.sampling_params import CONSTRAINT_KINDS, ConstraintKind, StructuredOutputsParams

__all__ = ["CONSTRAINT_KINDS", "ConstraintKind", "StructuredOutputsParams"]
