"""Core's built-in components pass their contracts: the paged KV cache manager, the
unquantized linear method, the tool parsers and the reasoning parsers."""

from kvserve.layers.linear import UnquantizedLinearMethod
from kvserve.testing import (
    KVCacheManagerContract,
    LoRAResolverContract,
    QuantizationMethodContract,
    ReasoningParserContract,
)
from kvserve.testing.contracts.tool_parser import HermesContract, Llama3JsonContract, MistralContract, PythonicContract


class TestPagedKVCacheManager(KVCacheManagerContract):
    kv_cache_manager = "paged"
    prefix_caching = True


class TestUnquantizedLinearMethod(QuantizationMethodContract):
    """Dense weights: the checkpoint tensors are the weight itself, exact up to float32 rounding."""

    quantization = "none"
    max_error = 0.0

    @classmethod
    def load_component(cls):
        # The engine builds it directly for unquantized checkpoints; it is not in the registry.
        return UnquantizedLinearMethod


class TestHermesToolParser(HermesContract):
    tool_parser = "hermes"


class TestLlama3JsonToolParser(Llama3JsonContract):
    tool_parser = "llama3_json"


class TestMistralToolParser(MistralContract):
    tool_parser = "mistral"


class TestPythonicToolParser(PythonicContract):
    tool_parser = "pythonic"


class TestDeepSeekR1ReasoningParser(ReasoningParserContract):
    reasoning_parser = "deepseek_r1"


class TestQwen3ReasoningParser(ReasoningParserContract):
    reasoning_parser = "qwen3"


class TestFilesystemLoRAResolver(LoRAResolverContract):
    lora_resolver = "filesystem"
