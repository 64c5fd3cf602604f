"""Core's own components, registered through the same hooks as any plugin."""

from kvserve import hookimpl


@hookimpl
def register_kv_cache_managers(register):
    register("paged", "kvserve.kv_cache.paged:PagedKVCacheManager", priority=0)


@hookimpl
def register_logits_processors(register):
    register("no_repeat_ngram", "kvserve.sampling.no_repeat_ngram:NoRepeatNGramLogitsProcessor")
