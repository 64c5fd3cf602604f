"""A fused layer's shards go to the kernel as parts: neighbours of one GGML type (whose blocks lie one after
another in ``qweight``) as one part, so SmolLM2's Q4_1 q/k/v is one part and Gemma's Q5_0 q/k + Q8_0 v two,
all in one kernel call. (The contract's fused-layer case checks the product against the stacked
dequantized shards.)"""

from kvserve.layers import MergedColumnLinear
from kvserve_quant_gguf.method import GGUFLinearMethod

SHARDS = ["attn.q_proj", "attn.k_proj", "attn.v_proj"]


def fused(types: list[str]) -> MergedColumnLinear:
    method = GGUFLinearMethod({"quant_method": "gguf", "tensor_types": dict(zip(SHARDS, types, strict=True))})
    return MergedColumnLinear(256, [64, 32, 32], False, method, "attn.qkv_proj", SHARDS)


def test_shards_of_one_type_are_one_part():
    assert fused(["Q4_1"] * 3).ggml_parts == (("Q4_1", 128),)


def test_a_change_of_type_starts_a_part():
    assert fused(["Q5_0", "Q5_0", "Q8_0"]).ggml_parts == (("Q5_0", 96), ("Q8_0", 32))
    assert fused(["Q8_0", "Q5_0", "Q8_0"]).ggml_parts == (("Q8_0", 64), ("Q5_0", 32), ("Q8_0", 32))
