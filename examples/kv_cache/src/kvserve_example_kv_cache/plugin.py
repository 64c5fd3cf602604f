"""Entry point: ``[project.entry-points.kvserve] example_kv_cache = "kvserve_example_kv_cache.plugin"``."""

from kvserve import hookimpl


@hookimpl
def register_kv_cache_managers(register):
    # Below core's paged manager (priority 0): kv_cache_manager="auto" keeps prefix caching.
    register("free_list", "kvserve_example_kv_cache.manager:FreeListKVCacheManager", priority=-10)
