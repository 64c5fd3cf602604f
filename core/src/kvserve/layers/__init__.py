"""Building blocks for model plugins (importing this package imports torch)."""

from kvserve.layers.activation import SiluAndMul
from kvserve.layers.attention import PagedAttention, attention_layers
from kvserve.layers.embedding import VocabEmbedding
from kvserve.layers.kv_store import store_kv
from kvserve.layers.layer_ops import LayerOpsModule, TorchLayerOps, use_layer_ops
from kvserve.layers.linear import (
    ColumnLinear,
    LinearBase,
    MergedColumnLinear,
    QKVLinear,
    RowLinear,
    UnquantizedLinearMethod,
)
from kvserve.layers.loading import load_checkpoint
from kvserve.layers.norm import RMSNorm
from kvserve.layers.packed_linear import PackedLinearMethod, pack_linear_weights
from kvserve.layers.rotary import RotaryEmbedding

__all__ = [
    "ColumnLinear",
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
    "load_checkpoint",
    "pack_linear_weights",
    "store_kv",
    "use_layer_ops",
]
