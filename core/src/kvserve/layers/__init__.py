"""Building blocks for model plugins (importing this package imports torch)."""

from kvserve.layers.attention import PagedAttention, attention_layers
from kvserve.layers.linear import QuantLinear, UnquantizedLinearMethod
from kvserve.layers.norm import RMSNorm
from kvserve.layers.rotary import RotaryEmbedding

__all__ = ["PagedAttention", "QuantLinear", "RMSNorm", "RotaryEmbedding", "UnquantizedLinearMethod", "attention_layers"]
