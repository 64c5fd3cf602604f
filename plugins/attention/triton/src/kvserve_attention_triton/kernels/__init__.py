"""The Triton kernels and their host-side launchers.

Importing this package imports triton and defines every ``@triton.jit`` function, so
``TRITON_INTERPRET=1`` (the CPU interpreter, for tests) must be set before the first import.
"""

from kvserve_attention_triton.kernels.plan import QueryBlocks, plan_query_blocks
from kvserve_attention_triton.kernels.split_kv import split_kv_attention
from kvserve_attention_triton.kernels.unified_attention import unified_attention
from kvserve_attention_triton.kernels.write_kv import write_kv

__all__ = ["QueryBlocks", "plan_query_blocks", "split_kv_attention", "unified_attention", "write_kv"]
