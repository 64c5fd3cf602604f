"""Core's own components, registered through the same hooks as any plugin."""

from kvserve import hookimpl


@hookimpl
def register_kv_cache_managers(register):
    register("paged", "kvserve.kv_cache.paged:PagedKVCacheManager", priority=0)


@hookimpl
def register_logits_processors(register):
    register("no_repeat_ngram", "kvserve.sampling.no_repeat_ngram:NoRepeatNGramLogitsProcessor")


@hookimpl
def register_reasoning_parsers(register):
    register("deepseek_r1", "kvserve.reasoning.think_tags:DeepSeekR1ReasoningParser")
    register("qwen3", "kvserve.reasoning.think_tags:Qwen3ReasoningParser")
