"""Entry point of kvserve-attention-flash-attn."""

from kvserve import hookimpl
from kvserve_attention_flash_attn.library import missing_reason


@hookimpl
def register_attention_backends(register):
    # ``unavailable`` is shown by ``kvserve plugins``; selection asks unsupported_reasons (same sentence).
    register(
        "flash_attn",
        "kvserve_attention_flash_attn.backend:FlashAttnBackend",
        priority=30,
        unavailable=missing_reason(),
    )
