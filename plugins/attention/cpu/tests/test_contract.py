"""kvserve-attention-cpu passes the attention backend contract (every dtype it claims)."""

from kvserve.testing import AttentionBackendContract


class TestCpuAttentionBackend(AttentionBackendContract):
    backend = "cpu"
    dtypes = ("float32", "bfloat16", "float16")
