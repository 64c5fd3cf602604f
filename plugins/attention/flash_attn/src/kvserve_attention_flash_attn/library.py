"""The flash-attn versions this backend is written for."""

from kvserve.optional_library import OptionalLibrary

# ``flash_attn_varlen_func`` takes ``block_table`` since 2.5.7 and ``softcap`` since 2.6.0;
# 3.x is FlashAttention 3, another API.
FLASH_ATTN = OptionalLibrary(
    distribution="flash-attn",
    name="flash-attn",
    minimum=(2, 6),
    below=(3, 0),
    install="pip install kvserve-attention-flash-attn[gpu]",
)
