"""The interfaces plugins implement. Importing this package does not import torch."""

from kvserve.interfaces.attention import AttentionBackend, AttentionBatch, AttentionSpec, LayerAttentionSpec
from kvserve.interfaces.gguf_architecture import GGUFArchitecture, GGUFMetadata
from kvserve.interfaces.kv_cache import KVCacheManager, KVCacheStats
from kvserve.interfaces.layer_ops import LayerOps
from kvserve.interfaces.linear_kernel import LinearKernel
from kvserve.interfaces.logits_constraint import LogitsConstraint
from kvserve.interfaces.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
from kvserve.interfaces.lora_kernel import LoRABatch, LoRAKernel
from kvserve.interfaces.lora_resolver import LoRAResolver
from kvserve.interfaces.model import Model
from kvserve.interfaces.platform import DeviceCapability, Platform
from kvserve.interfaces.proposer import DraftProposer, DraftRequest, TargetModel
from kvserve.interfaces.quantization import ParamLoading, QuantizationMethod
from kvserve.interfaces.reasoning_parser import ReasoningParser
from kvserve.interfaces.sampling_kernel import SamplingKernel
from kvserve.interfaces.scheduler import AdmissionRule, ScheduledRequest, Scheduler, SchedulerOutput
from kvserve.interfaces.structured_output import StructuredOutputBackend
from kvserve.interfaces.tool_parser import ExtractedToolCalls, FunctionCall, ToolCallDelta, ToolParser, ToolParserDelta

__all__ = [
    "AdmissionRule",
    "AttentionBackend",
    "AttentionBatch",
    "AttentionSpec",
    "BatchUpdate",
    "DeviceCapability",
    "DraftProposer",
    "DraftRequest",
    "ExtractedToolCalls",
    "FunctionCall",
    "GGUFArchitecture",
    "GGUFMetadata",
    "KVCacheManager",
    "KVCacheStats",
    "LayerAttentionSpec",
    "LayerOps",
    "LinearKernel",
    "LogitsConstraint",
    "LogitsProcessor",
    "LoRABatch",
    "LoRAKernel",
    "LoRAResolver",
    "Model",
    "MoveDirectionality",
    "ParamLoading",
    "Platform",
    "QuantizationMethod",
    "ReasoningParser",
    "SamplingKernel",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerOutput",
    "StructuredOutputBackend",
    "TargetModel",
    "ToolCallDelta",
    "ToolParser",
    "ToolParserDelta",
]
