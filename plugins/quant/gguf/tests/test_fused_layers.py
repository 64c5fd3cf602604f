"""A fused layer's shards go to the kernel in runs: neighbours of one GGML type (whose blocks lie one after
another in ``qweight``) as one product, so SmolLM2's Q4_1 q/k/v is one call and Gemma's Q5_0 q/k + Q8_0 v two.
(The contract's fused-layer case checks the runs' products against the stacked dequantized shards.)"""

from kvserve.layers import MergedColumnLinear
from kvserve_quant_gguf.method import GGUFLinearMethod

SHARDS = ["attn.q_proj", "attn.k_proj", "attn.v_proj"]


def fused(types: list[str]) -> MergedColumnLinear:
    method = GGUFLinearMethod({"quant_method": "gguf", "tensor_types": dict(zip(SHARDS, types, strict=True))})
    return MergedColumnLinear(256, [64, 32, 32], False, method, "attn.qkv_proj", SHARDS)


def runs(layer: MergedColumnLinear) -> list[tuple[str, int, int, int]]:
    return [(fmt.name, rows, start, stop) for fmt, rows, start, stop in layer.ggml_runs]


def test_shards_of_one_type_are_one_run():
    # Q4_1: 8 blocks of 20 bytes a row of 256 weights.
    assert runs(fused(["Q4_1"] * 3)) == [("Q4_1", 128, 0, 128 * 160)]


def test_a_change_of_type_starts_a_run():
    # Q5_0: 8 blocks of 22 bytes a row; Q8_0: 8 of 34.
    assert runs(fused(["Q5_0", "Q5_0", "Q8_0"])) == [
        ("Q5_0", 96, 0, 96 * 176),
        ("Q8_0", 32, 96 * 176, 96 * 176 + 32 * 272),
    ]
    assert [name for name, *_ in runs(fused(["Q8_0", "Q5_0", "Q8_0"]))] == ["Q8_0", "Q5_0", "Q8_0"]
