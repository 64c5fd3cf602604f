"""One contract class per plugin kind; this index is cheap to import (no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContractInfo:
    """Where a kind's contract lives and the class attribute that names the component under test."""

    kind: str
    module: str
    class_name: str
    name_attribute: str

    @property
    def target(self) -> str:
        return f"{self.module}:{self.class_name}"


CONTRACTS: dict[str, ContractInfo] = {
    info.kind: info
    for info in (
        ContractInfo("platform", "kvserve.testing.contracts.platform", "PlatformContract", "platform"),
        ContractInfo("attention_backend", "kvserve.testing.contracts.attention", "AttentionBackendContract", "backend"),
        ContractInfo(
            "kv_cache_manager", "kvserve.testing.contracts.kv_cache", "KVCacheManagerContract", "kv_cache_manager"
        ),
        ContractInfo("scheduler", "kvserve.testing.contracts.scheduler", "SchedulerContract", "scheduler"),
        ContractInfo("model", "kvserve.testing.contracts.model", "ModelContract", "architecture"),
        ContractInfo(
            "quantization_method",
            "kvserve.testing.contracts.quantization",
            "QuantizationMethodContract",
            "quantization",
        ),
        ContractInfo(
            "logits_processor",
            "kvserve.testing.contracts.logits_processor",
            "LogitsProcessorContract",
            "logits_processor",
        ),
        ContractInfo(
            "structured_output_backend",
            "kvserve.testing.contracts.structured_output",
            "StructuredOutputBackendContract",
            "backend",
        ),
        ContractInfo("tool_parser", "kvserve.testing.contracts.tool_parser", "ToolParserContract", "tool_parser"),
        ContractInfo(
            "reasoning_parser",
            "kvserve.testing.contracts.reasoning_parser",
            "ReasoningParserContract",
            "reasoning_parser",
        ),
        ContractInfo(
            "gguf_architecture",
            "kvserve.testing.contracts.gguf_architecture",
            "GGUFArchitectureContract",
            "gguf_architecture",
        ),
        ContractInfo("proposer", "kvserve.testing.contracts.proposer", "DraftProposerContract", "proposer"),
        ContractInfo(
            "lora_resolver", "kvserve.testing.contracts.lora_resolver", "LoRAResolverContract", "lora_resolver"
        ),
    )
}
"""Plugin kind -> its contract (every kind of ``kvserve.plugins.KINDS`` has one)."""
