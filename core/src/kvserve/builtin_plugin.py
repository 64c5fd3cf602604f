"""Core's own components, registered through the same hooks as any plugin."""

from kvserve import hookimpl


@hookimpl
def register_kv_cache_managers(register):
    register("paged", "kvserve.kv_cache.paged:PagedKVCacheManager", priority=0)


@hookimpl
def register_logits_processors(register):
    register("no_repeat_ngram", "kvserve.sampling.no_repeat_ngram:NoRepeatNGramLogitsProcessor")


TOOL_PARSERS = {
    "hermes": ("kvserve.tool_calling.hermes:HermesToolParser", "HermesContract"),
    "llama3_json": ("kvserve.tool_calling.llama3_json:Llama3JsonToolParser", "Llama3JsonContract"),
    "mistral": ("kvserve.tool_calling.mistral:MistralToolParser", "MistralContract"),
    "pythonic": ("kvserve.tool_calling.pythonic:PythonicToolParser", "PythonicContract"),
}


@hookimpl
def register_tool_parsers(register):
    # Each with the contract subclass that holds canned replies in its format.
    for name, (target, contract) in TOOL_PARSERS.items():
        register(name, target, contract=f"kvserve.testing.contracts.tool_parser:{contract}")


@hookimpl
def register_proposers(register):
    register("ngram", "kvserve.spec_decode.ngram:NgramProposer")
    register(
        "draft_model",
        "kvserve.spec_decode.draft_model:DraftModelProposer",
        contract="kvserve.testing.contracts.proposer:DraftModelContract",
    )


@hookimpl
def register_reasoning_parsers(register):
    register("deepseek_r1", "kvserve.reasoning.think_tags:DeepSeekR1ReasoningParser")
    register("qwen3", "kvserve.reasoning.think_tags:Qwen3ReasoningParser")


@hookimpl
def register_lora_resolvers(register):
    register("filesystem", "kvserve.lora.filesystem_resolver:FilesystemResolver")
