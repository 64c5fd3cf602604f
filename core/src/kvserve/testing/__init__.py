"""Contract suites for kvserve plugins, and the test kit they are built from.

A plugin's ``tests/test_contract.py`` subclasses the contract of its kind and names the
component by its registry name; pytest then runs every check of the contract against it::

    from kvserve.testing import AttentionBackendContract

    class TestMyBackend(AttentionBackendContract):
        backend = "my_backend"

One contract per interface: :class:`PlatformContract`, :class:`AttentionBackendContract`,
:class:`KVCacheManagerContract`, :class:`SchedulerContract`, :class:`ModelContract`,
:class:`QuantizationMethodContract`, :class:`LogitsProcessorContract`,
:class:`StructuredOutputBackendContract`, :class:`ToolParserContract`, :class:`ReasoningParserContract`,
:class:`GGUFArchitectureContract`, :class:`DraftProposerContract` and :class:`LoRAResolverContract`.
``kvserve plugins check`` runs the same suites against installed plugins. The package is also a pytest
plugin (entry point ``pytest11: kvserve``).

Importing ``kvserve.testing`` is cheap: the contracts (and torch) load on first attribute use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvserve.testing.check import contract_for
    from kvserve.testing.contracts.attention import AttentionBackendContract
    from kvserve.testing.contracts.gguf_architecture import GGUFArchitectureContract
    from kvserve.testing.contracts.kv_cache import KVCacheManagerContract
    from kvserve.testing.contracts.logits_processor import LogitsProcessorContract
    from kvserve.testing.contracts.lora_resolver import LoRAResolverContract
    from kvserve.testing.contracts.model import ModelContract
    from kvserve.testing.contracts.platform import PlatformContract
    from kvserve.testing.contracts.proposer import DraftModelContract, DraftProposerContract
    from kvserve.testing.contracts.quantization import QuantizationMethodContract
    from kvserve.testing.contracts.reasoning_parser import ReasoningParserContract
    from kvserve.testing.contracts.scheduler import SchedulerContract
    from kvserve.testing.contracts.structured_output import StructuredOutputBackendContract
    from kvserve.testing.contracts.tool_parser import ToolParserCase, ToolParserContract

_LAZY = {
    "AttentionBackendContract": "kvserve.testing.contracts.attention",
    "GGUFArchitectureContract": "kvserve.testing.contracts.gguf_architecture",
    "DraftModelContract": "kvserve.testing.contracts.proposer",
    "DraftProposerContract": "kvserve.testing.contracts.proposer",
    "KVCacheManagerContract": "kvserve.testing.contracts.kv_cache",
    "LogitsProcessorContract": "kvserve.testing.contracts.logits_processor",
    "LoRAResolverContract": "kvserve.testing.contracts.lora_resolver",
    "ModelContract": "kvserve.testing.contracts.model",
    "PlatformContract": "kvserve.testing.contracts.platform",
    "QuantizationMethodContract": "kvserve.testing.contracts.quantization",
    "ReasoningParserContract": "kvserve.testing.contracts.reasoning_parser",
    "SchedulerContract": "kvserve.testing.contracts.scheduler",
    "StructuredOutputBackendContract": "kvserve.testing.contracts.structured_output",
    "ToolParserCase": "kvserve.testing.contracts.tool_parser",
    "ToolParserContract": "kvserve.testing.contracts.tool_parser",
    "contract_for": "kvserve.testing.check",
}

__all__ = [
    "AttentionBackendContract",
    "GGUFArchitectureContract",
    "DraftModelContract",
    "DraftProposerContract",
    "KVCacheManagerContract",
    "LogitsProcessorContract",
    "LoRAResolverContract",
    "ModelContract",
    "PlatformContract",
    "QuantizationMethodContract",
    "ReasoningParserContract",
    "SchedulerContract",
    "StructuredOutputBackendContract",
    "ToolParserCase",
    "ToolParserContract",
    "contract_for",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvserve.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
