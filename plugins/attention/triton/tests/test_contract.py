"""kvserve-attention-triton passes the attention backend contract, in the interpreter without a GPU."""

import torch

from kvserve_attention_triton.contract import TritonAttentionContract


class TestTritonAttentionBackend(TritonAttentionContract):
    backend = "triton"
    if not torch.cuda.is_available():
        # the interpreter's time: float16 runs in test_kernels.py; `kvserve plugins check` runs all three
        dtypes = ("float32", "bfloat16")
