"""kvserve-attention-flashinfer: paged attention on FlashInfer (``flashinfer`` is imported only when used)."""
