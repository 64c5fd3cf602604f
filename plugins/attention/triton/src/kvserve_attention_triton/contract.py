"""The attention contract as ``kvserve plugins check`` runs it for this backend: on a GPU
platform when one is available, otherwise on the CPU platform in Triton's interpreter."""

from kvserve.testing import AttentionBackendContract


class TritonAttentionContract(AttentionBackendContract):
    """Every dtype the backend claims; without a GPU, the kernels run under ``TRITON_INTERPRET=1``."""

    interpreter_on_cpu = True
    dtypes = ("float32", "bfloat16", "float16")
    probe_head_sizes = (32, 80, 96, 256)
