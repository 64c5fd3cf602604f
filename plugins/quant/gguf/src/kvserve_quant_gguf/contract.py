"""The quantization contract of the ``gguf`` method, one case per GGML type, shipped with the plugin
so that ``kvserve plugins check`` can run it.

The reference is gguf-py's own: ``gguf.quants.quantize`` writes the blocks (F16 to Q8_0) and
``gguf.quants.dequantize`` reads them back. gguf-py has no K-quant quantizer, so Q4_K, Q5_K and Q6_K
blocks are written here by a plain round-to-nearest encoder of the published layouts (not
llama.cpp's search for the best scales); gguf-py's dequantization still defines what they mean,
and the contract's bound against the float weight fails if the encoder packs a field wrongly.
"""

from __future__ import annotations

from typing import ClassVar

import gguf
import numpy as np
import torch

from kvserve.testing import QuantizationMethodContract

QK_K = 256


def _f16(values: np.ndarray) -> np.ndarray:
    """float16 values, clamped to finite, as two bytes each ``[n, 2]``."""
    return values.astype(np.float16).reshape(-1, 1).view(np.uint8)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast_shapes(a.shape, b.shape), np.float32), where=b != 0)


def _k_scale_min(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K/Q5_K for super-blocks ``x [n, 8, 32]``: the header bytes (d, dmin, 12 scale bytes) and the
    unsigned quants ``[n, 8, 32]``."""
    low = np.minimum(x.min(-1), 0)
    scale = (x.max(-1) - low) / levels
    d = _f16(scale.max(-1) / 63).view(np.float16).astype(np.float32)
    dmin = _f16(-low.min(-1) / 63).view(np.float16).astype(np.float32)
    sc = np.clip(np.round(_divide(scale, d)), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(_divide(-low, dmin)), 0, 63).astype(np.uint8)
    step, offset = d * sc, dmin * mn
    q = np.clip(np.round(_divide(x + offset[..., None], step[..., None])), 0, levels).astype(np.uint8)
    packed = np.concatenate(
        [
            (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6),
            (mn[:, :4] & 0x3F) | ((mn[:, 4:] >> 4) << 6),
            (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4),
        ],
        axis=1,
    )
    return np.concatenate([_f16(d), _f16(dmin), packed], axis=1), q


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    head, q = _k_scale_min(x.reshape(-1, 8, 32), 15)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(-1, 128)
    return np.concatenate([head, qs], axis=1)


def _quantize_q5_k(x: np.ndarray) -> np.ndarray:
    head, q = _k_scale_min(x.reshape(-1, 8, 32), 31)
    low = q & 0x0F
    qs = (low[:, 0::2] | (low[:, 1::2] << 4)).reshape(-1, 128)
    qh = sum(((q[:, i] >> 4) << i) for i in range(8)).astype(np.uint8)
    return np.concatenate([head, qh, qs], axis=1)


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    sub = x.reshape(-1, 16, 16)
    scale = np.abs(sub).max(-1) / 31
    d = _f16(scale.max(-1) / 127).view(np.float16).astype(np.float32)
    sc = np.clip(np.round(_divide(scale, d)), -128, 127).astype(np.int8)
    step = (d * sc.astype(np.float32))[..., None]
    u = (np.clip(np.round(_divide(sub, step)), -32, 31) + 32).astype(np.uint8).reshape(-1, 8, 32)
    ql = np.zeros((u.shape[0], 2, 64), np.uint8)
    qh = np.zeros((u.shape[0], 2, 32), np.uint8)
    # Row r of 32 weights: half r // 4 of ql/qh, nibble (r // 2) % 2 of bytes (r % 2) * 32.., qh bits 2 * (r % 4).
    for row in range(8):
        half, part = row // 4, row % 2
        ql[:, half, part * 32 : part * 32 + 32] |= (u[:, row] & 0x0F) << (4 * ((row // 2) % 2))
        qh[:, half] |= (u[:, row] >> 4) << (2 * (row % 4))
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), _f16(d)], axis=1)


K_QUANTIZERS = {"Q4_K": _quantize_q4_k, "Q5_K": _quantize_q5_k, "Q6_K": _quantize_q6_k}


def quantize_rows(weight: np.ndarray, type_name: str) -> np.ndarray:
    """float32 ``[out, in]`` as the GGML type's blocks, uint8 ``[out, bytes_per_row]`` (reference encoders)."""
    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name in K_QUANTIZERS:
        blocks = K_QUANTIZERS[type_name](weight.astype(np.float32).reshape(-1, QK_K))
        return blocks.reshape(weight.shape[0], -1)
    return gguf.quants.quantize(weight.astype(np.float32), qtype).view(np.uint8).reshape(weight.shape[0], -1)


class GGUFContract(QuantizationMethodContract):
    """A layer of one GGML type: the checkpoint tensor is ``qweight``, the file's blocks (flat uint8)."""

    quantization = "gguf"
    ggml_type: ClassVar[str]
    in_features: ClassVar[int] = 512
    """Every layer tested has this many input features (two K super-blocks): flat blocks say how many
    bytes a layer holds, not its shape, so :meth:`dequantize` needs it."""
    shapes = ((512, 32), (512, 80))
    # Rows of bfloat16/float16 activations may run on the platform's GGML kernel, which quantizes a single row
    # per block to int8 as llama.cpp does (measured 0.4% relative in float16) and rounds more rows to
    # bfloat16; float32 stays exact.
    reference_tolerance: ClassVar[dict[str, float]] = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2}

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"qweight": torch.from_numpy(quantize_rows(weight.numpy(), self.ggml_type).reshape(-1))}

    def dequantize(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        qtype = gguf.GGMLQuantizationType[self.ggml_type]
        rows = tensors["qweight"].numpy().reshape(-1, gguf.quant_shape_to_byte_shape((self.in_features,), qtype)[0])
        return torch.from_numpy(np.asarray(gguf.quants.dequantize(rows, qtype), dtype=np.float32))


def _case(type_name: str, max_error: float) -> type[GGUFContract]:
    """The case of one type; its ``quant_config`` is what ``kvserve.loader`` reads from a file whose
    weights (the contract's layer names) are all of that type."""
    names = ["layer", "attn.q_proj", "attn.k_proj", "attn.v_proj"]
    quant_config = {"quant_method": "gguf", "tensor_types": dict.fromkeys(names, type_name), "split_count": 1}
    attributes = {"ggml_type": type_name, "max_error": max_error, "quant_config": quant_config}
    return type(f"GGUF{type_name}Contract", (GGUFContract,), attributes)


# Bounds against the float weight (Gaussian [80, 512]: measured 2e-4, 1.7e-3, .086, .078, .043, .038,
# .0054, .079, .038, .019 in this order), with ~25% headroom.
GGUFF16Contract = _case("F16", 0.0005)
GGUFBF16Contract = _case("BF16", 0.004)
GGUFQ4_0Contract = _case("Q4_0", 0.11)
GGUFQ4_1Contract = _case("Q4_1", 0.1)
GGUFQ5_0Contract = _case("Q5_0", 0.06)
GGUFQ5_1Contract = _case("Q5_1", 0.05)
GGUFQ8_0Contract = _case("Q8_0", 0.008)
GGUFQ4_KContract = _case("Q4_K", 0.1)
GGUFQ5_KContract = _case("Q5_K", 0.05)
GGUFQ6_KContract = _case("Q6_K", 0.03)
CONTRACTS = [
    GGUFF16Contract, GGUFBF16Contract, GGUFQ4_0Contract, GGUFQ4_1Contract, GGUFQ5_0Contract, GGUFQ5_1Contract,
    GGUFQ8_0Contract, GGUFQ4_KContract, GGUFQ5_KContract, GGUFQ6_KContract,
]  # fmt: skip
"""One case per GGML type the method runs."""
