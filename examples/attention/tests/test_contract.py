"""The example backend passes the attention backend contract.

Its KV layout is a permutation of ``(2, blocks, block_size, kv_heads, head_dim)``, which the
contract reads by itself; a packed layout would override ``kv_slots`` here.
"""

from kvserve.testing import AttentionBackendContract


class TestNaiveAttentionBackend(AttentionBackendContract):
    backend = "naive"
