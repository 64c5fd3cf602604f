"""GGUF layers under tensor parallelism keep their GGML blocks, each rank only its whole blocks: a
column-parallel rank its rows of every shard (a fused layer's shards of different types each cut by
its own row size), a row-parallel rank the blocks of its input features in every row, refused by
name where its slice would cut a block; the embedded SmolLM2 over three gloo ranks (its 9 query
heads split over no fewer) generates the greedy tokens of one rank, each holding a third of the
weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve import LLM, SamplingParams, distributed
from kvserve.errors import ConfigError
from kvserve.layers import MergedColumnLinear, RowLinear, VocabEmbedding
from kvserve.loader.default_model import embedded_gguf_path
from kvserve_quant_gguf.contract import quantize_rows
from kvserve_quant_gguf.ggml import FORMATS
from kvserve_quant_gguf.method import GGUFLinearMethod

IN = 512
"""Input features of every layer here: two K-quant super-blocks, sixteen 32-weight blocks."""
TYPES = {"q": "Q5_0", "k": "Q8_0", "v": "Q4_K", "down": "Q4_K", "o": "Q8_0", "embed": "Q8_0", "bad": "Q8_0"}


@pytest.fixture
def method() -> GGUFLinearMethod:
    return GGUFLinearMethod({"quant_method": "gguf", "tensor_types": TYPES, "split_count": 1})


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, ranks: int) -> None:
    """Build layers as rank ``rank`` of ``ranks`` would (no collective runs here)."""
    monkeypatch.setattr(distributed, "rank", lambda: rank)
    monkeypatch.setattr(distributed, "world_size", lambda: ranks)


def blocks(rows: int, in_features: int, type_name: str, seed: int = 0) -> torch.Tensor:
    """A random ``[rows, in_features]`` weight as the type's blocks, uint8 ``[rows, row bytes]``."""
    weight = np.random.default_rng(seed).standard_normal((rows, in_features)).astype(np.float32)
    return torch.from_numpy(quantize_rows(weight, type_name))


def dequantized(rows: torch.Tensor, type_name: str) -> torch.Tensor:
    """The float32 weight the type's blocks ``rows [rows, row bytes]`` hold."""
    fmt = FORMATS[type_name]
    return fmt.dequantize(rows.reshape(-1), rows.shape[1] // fmt.type_size * fmt.block_size, torch.float32)


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_column_rank_holds_its_rows_of_each_shards_blocks(method, monkeypatch, ranks):
    sizes = {"q": 64, "k": 32, "v": 32}
    full = {name: blocks(rows, IN, TYPES[name], seed) for seed, (name, rows) in enumerate(sizes.items())}
    x = torch.randn(3, IN)
    for rank in range(ranks):
        as_rank(monkeypatch, rank, ranks)
        layer = MergedColumnLinear(IN, list(sizes.values()), False, method, "qkv", list(sizes))
        for shard, name in enumerate(sizes):
            layer.load("qweight", full[name].reshape(-1), shard)  # flat, as the GGUF loader yields it
        mine = {name: full[name][rank * rows // ranks : (rank + 1) * rows // ranks] for name, rows in sizes.items()}
        assert torch.equal(layer.qweight.data, torch.cat([rows.reshape(-1) for rows in mine.values()]))
        weight = torch.cat([dequantized(rows, TYPES[name]) for name, rows in mine.items()])
        torch.testing.assert_close(method.apply(layer, x, None), x @ weight.T)


@pytest.mark.parametrize(("name", "ranks"), [("down", 2), ("o", 2), ("o", 4)])
def test_a_row_rank_holds_the_blocks_of_its_input_features(method, monkeypatch, name, ranks):
    fmt = FORMATS[TYPES[name]]
    full, x = blocks(48, IN, fmt.name), torch.randn(3, IN)
    share = fmt.row_bytes(IN) // ranks
    partials = []
    for rank in range(ranks):
        as_rank(monkeypatch, rank, ranks)
        layer = RowLinear(IN, 48, False, method, name)
        layer.load("qweight", full.reshape(-1))
        mine = full[:, rank * share : (rank + 1) * share]
        assert torch.equal(layer.qweight.data, mine.reshape(-1)) and layer.qweight.numel() * ranks == full.numel()
        features = slice(rank * IN // ranks, (rank + 1) * IN // ranks)
        partials.append(method.apply(layer, x[:, features], None))
    # The ranks' partial products sum (the all-reduce) to the whole layer's.
    torch.testing.assert_close(sum(partials), x @ dequantized(full, fmt.name).T, rtol=1e-5, atol=1e-4)


def test_a_row_slice_that_cuts_a_block_is_refused_by_name(method, monkeypatch):
    as_rank(monkeypatch, 0, 4)
    with pytest.raises(
        ConfigError,
        match=r"tensor_parallel_size: 4 ranks would split the 512 input features of down, a Q4_K weight of "
        r"256-weight blocks, into 128 per rank, which cuts its blocks .*divides its 2 blocks per row",
    ):
        RowLinear(IN, 48, False, method, "down")
    as_rank(monkeypatch, 1, 2)
    with pytest.raises(ConfigError, match=r"2 ranks would split the 96 input features of bad, a Q8_0 weight of 32-"):
        RowLinear(96, 48, False, method, "bad")


def test_the_embedding_keeps_its_vocabulary_shards_blocks(method, monkeypatch):
    full = blocks(100, IN, "Q8_0")  # 100 ids padded to 128: 64 a rank, 36 of them real on rank 1
    for rank, rows in ((0, slice(0, 64)), (1, slice(64, 100))):
        as_rank(monkeypatch, rank, 2)
        embedding = VocabEmbedding(100, IN, method, "embed")
        embedding.quantized.load("qweight", full.reshape(-1))
        assert embedding.weight.numel() == 0 and torch.equal(embedding.quantized.qweight.data, full[rows].reshape(-1))
        ids = torch.tensor([3, 0, 35])  # the shard's own rows
        torch.testing.assert_close(
            method.embedding(embedding.quantized, ids), dequantized(full[rows][ids], "Q8_0"), rtol=0, atol=0
        )


def test_smollm2_on_three_ranks_matches_one_and_holds_a_third_each():
    """float32 (dequantized products: the ranks' partial sums differ from one rank's only in rounding).
    Three ranks, not two: SmolLM2-135M's 9 query heads do not split over two."""
    prompts = ["What is the capital of France?", "List three prime numbers:"]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 32}
    path = str(embedded_gguf_path())

    def run(**parallel) -> tuple[list[list[int]], list[int]]:
        llm = LLM(path, **engine, **parallel)
        try:
            tokens = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
            return tokens, [info.weight_bytes for info in llm.engine.executor.rank_infos]
        finally:
            llm.engine.shutdown()

    one, (whole,) = run()
    three, shards = run(tensor_parallel_size=3)
    print(
        f"weights resident: {whole / 2**20:.1f} MiB on one rank, {[round(b / 2**20, 1) for b in shards]} MiB on three"
    )
    assert three == one
    # Every linear layer and the embedding split evenly; only the norms (0.1 MiB) are on every rank.
    assert all(abs(b - whole / 3) < 0.01 * whole / 3 for b in shards), (whole, shards)
