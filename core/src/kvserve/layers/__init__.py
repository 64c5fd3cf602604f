"""Building blocks for model plugins (importing this package imports torch)."""

from kvserve.layers.activation import GeluTanhAndMul, SiluAndMul, gated_activation
from kvserve.layers.attention import PagedAttention, attention_layers
from kvserve.layers.decoder import (
    DecoderAttention,
    DecoderForCausalLM,
    DecoderLayer,
    DecoderModel,
    DecoderSpec,
    GatedMLP,
    head_dim_of,
)
from kvserve.layers.embedding import VocabEmbedding
from kvserve.layers.kv_store import store_kv
from kvserve.layers.layer_ops import EagerAndGraphLayerOps, LayerOpsModule, TorchLayerOps, use_layer_ops
from kvserve.layers.linear import (
    ColumnLinear,
    LinearBase,
    MergedColumnLinear,
    QKVLinear,
    RowLinear,
    UnquantizedLinearMethod,
)
from kvserve.layers.loading import checkpoint_targets, load_checkpoint
from kvserve.layers.norm import RMSNorm
from kvserve.layers.packed_linear import PackedLinearMethod, pack_linear_weights
from kvserve.layers.rotary import RotaryEmbedding

__all__ = [
    "ColumnLinear",
    "DecoderAttention",
    "DecoderForCausalLM",
    "DecoderLayer",
    "DecoderModel",
    "DecoderSpec",
    "EagerAndGraphLayerOps",
    "GatedMLP",
    "GeluTanhAndMul",
    "LayerOpsModule",
    "LinearBase",
    "MergedColumnLinear",
    "PackedLinearMethod",
    "PagedAttention",
    "QKVLinear",
    "RMSNorm",
    "RotaryEmbedding",
    "RowLinear",
    "SiluAndMul",
    "TorchLayerOps",
    "UnquantizedLinearMethod",
    "VocabEmbedding",
    "attention_layers",
    "checkpoint_targets",
    "gated_activation",
    "head_dim_of",
    "load_checkpoint",
    "pack_linear_weights",
    "store_kv",
    "use_layer_ops",
]
