"""The example manager passes the KV cache manager contract (it claims no prefix caching)."""

from kvserve.testing import KVCacheManagerContract


class TestFreeListKVCacheManager(KVCacheManagerContract):
    kv_cache_manager = "free_list"
    prefix_caching = False
