"""Entry point of kvserve-attention-flash-attn."""

from kvserve import hookimpl
from kvserve_attention_flash_attn.library import FLASH_ATTN


@hookimpl
def register_attention_backends(register):
    # ``unavailable`` is shown by ``kvserve plugins``; selection asks unsupported_reasons (same sentence).
    register(
        "flash_attn",
        "kvserve_attention_flash_attn.backend:FlashAttnBackend",
        priority=30,
        unavailable=FLASH_ATTN.missing_reason(),
    )
