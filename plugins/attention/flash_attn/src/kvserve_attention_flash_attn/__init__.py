"""kvserve-attention-flash-attn: paged attention on FlashAttention 2 (``flash_attn`` is imported only when used)."""
