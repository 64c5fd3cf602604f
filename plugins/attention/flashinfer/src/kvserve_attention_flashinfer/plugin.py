"""Entry point of kvserve-attention-flashinfer."""

from kvserve import hookimpl
from kvserve_attention_flashinfer.library import FLASHINFER


@hookimpl
def register_attention_backends(register):
    # ``unavailable`` is shown by ``kvserve plugins``; selection asks unsupported_reasons (same sentence).
    register(
        "flashinfer",
        "kvserve_attention_flashinfer.backend:FlashInferBackend",
        priority=40,
        unavailable=FLASHINFER.missing_reason(),
    )
