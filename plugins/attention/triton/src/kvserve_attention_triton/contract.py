"""The attention contract as ``kvserve plugins check`` runs it for this backend: on a GPU
platform when one is available, otherwise on the CPU platform in Triton's interpreter."""

from kvserve.testing import AttentionBackendContract


class TritonAttentionContract(AttentionBackendContract):
    """Every dtype the backend claims; without a GPU, the kernels run under ``TRITON_INTERPRET=1``."""

    host_interpreter_env = {"TRITON_INTERPRET": "1"}  # read when each @triton.jit is defined
    host_interpreter_modules = ("triton",)
    dtypes = ("float32", "bfloat16", "float16")
    probe_head_sizes = (32, 80, 96, 256)
