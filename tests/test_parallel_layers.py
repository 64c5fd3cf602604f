"""Tensor-parallel core layers on two gloo ranks: each rank loads its slice of full checkpoint
tensors; column outputs are that rank's slice of the one-device output, row outputs (summed over
ranks) equal it; q/k/v heads split, or KV heads replicate when there are fewer than ranks; row
layers cut grouped parameters on group boundaries and load replicated ones whole; shards packed at
different rates (``ParamLoading.shard_groups``) load their rank's rows or groups, flat; the vocab
embedding holds a padded vocabulary shard, looks up every id and gathers full logits on rank 0,
dense or kept in a quantization method's format (``keeps_embedding``)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

from kvserve import distributed
from kvserve.errors import ConfigError, WeightLoadError
from kvserve.interfaces import ParamLoading
from kvserve.layers import (
    ColumnLinear,
    LinearBase,
    MergedColumnLinear,
    QKVLinear,
    RowLinear,
    UnquantizedLinearMethod,
    VocabEmbedding,
)

RANKS = 2
HIDDEN, HEAD_DIM = 16, 4


class PackedNoInputDim(UnquantizedLinearMethod):
    """A packed weight (two output features per element) that does not say its input dimension."""

    name = "packed_no_input_dim"

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix):
        layer.add_param("packed", torch.zeros(input_size, sum(output_sizes) // 2), ParamLoading(1, packed_factor=2))

    def apply(self, layer, x, bias):
        return x @ layer.packed.repeat_interleave(2, dim=1)


class GroupScaled(UnquantizedLinearMethod):
    """A dense weight times one scale per group of 4 input features (AWQ's ``scales`` layout) and a
    per-tensor gain every rank keeps whole."""

    name = "group_scaled"

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix):
        super().create_weights(layer, input_size, output_sizes, params_dtype, prefix)
        groups = ParamLoading(output_dim=None, input_dim=0, input_group=4)
        layer.add_param("group_scale", torch.zeros(input_size // 4), groups)
        layer.add_param("gain", torch.zeros(1), ParamLoading(output_dim=None, input_replicated=True))

    def apply(self, layer, x, bias):
        return F.linear(x * layer.group_scale.repeat_interleave(4) * layer.gain, layer.weight, bias)


class FlatMixed(UnquantizedLinearMethod):
    """Two shards in one flat parameter at different rates, as GGUF's blocks are: shard 0 one element
    per input feature, shard 1 two elements per group of 4 input features (the loading only)."""

    name = "flat_mixed"
    GROUPS = ((1, 1), (4, 2))

    def create_weights(self, layer, input_size, output_sizes, params_dtype, prefix):
        sizes = [rows * input_size // f * e for (f, e), rows in zip(self.GROUPS, output_sizes)]
        offsets = (0, sizes[0], sizes[0] + sizes[1])
        layer.add_param("flat", torch.zeros(offsets[-1]), ParamLoading(shard_offsets=offsets, shard_groups=self.GROUPS))

    def apply(self, layer, x, bias):
        raise NotImplementedError


class KeptEmbedding(UnquantizedLinearMethod):
    """Keeps the embedding as its own (dense) linear layer, looked up by :meth:`embedding`."""

    name = "kept_embedding"

    def keeps_embedding(self, prefix):
        return True

    def embedding(self, layer, ids):
        return F.embedding(ids, layer.weight)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    distributed.init(rank, RANKS, "gloo", f"tcp://127.0.0.1:{port}")
    try:
        _check_layers(rank)
    finally:
        distributed.destroy()


def _check_layers(rank: int) -> None:
    torch.manual_seed(0)  # every rank draws the same full tensors
    method = UnquantizedLinearMethod()
    x = torch.randn(3, HIDDEN)

    w, b = torch.randn(12, HIDDEN), torch.randn(12)
    column = ColumnLinear(HIDDEN, 12, True, method, "col")
    column.load("weight", w), column.load("bias", b)
    torch.testing.assert_close(column(x), (x @ w.T + b)[:, rank * 6 : rank * 6 + 6])

    gate, up = torch.randn(8, HIDDEN), torch.randn(8, HIDDEN)
    merged = MergedColumnLinear(HIDDEN, [8, 8], False, method, "gate_up", ["gate", "up"])
    merged.load("weight", gate, 0), merged.load("weight", up, 1)
    expected = torch.cat([(x @ gate.T)[:, rank * 4 : rank * 4 + 4], (x @ up.T)[:, rank * 4 : rank * 4 + 4]], -1)
    torch.testing.assert_close(merged(x), expected)

    for kv_heads, kv_cols in ((2, slice(rank * HEAD_DIM, (rank + 1) * HEAD_DIM)), (1, slice(0, HEAD_DIM))):
        q, k, v = (
            torch.randn(4 * HEAD_DIM, HIDDEN),
            torch.randn(kv_heads * HEAD_DIM, HIDDEN),
            torch.randn(kv_heads * HEAD_DIM, HIDDEN),
        )
        qkv = QKVLinear(HIDDEN, 4, kv_heads, HEAD_DIM, False, method, "qkv", ["q", "k", "v"])
        for shard, tensor in enumerate((q, k, v)):
            qkv.load("weight", tensor, shard)
        assert (qkv.num_heads, qkv.num_kv_heads) == (2, 1)
        q_cols = slice(rank * 2 * HEAD_DIM, (rank + 1) * 2 * HEAD_DIM)
        expected = torch.cat([(x @ q.T)[:, q_cols], (x @ k.T)[:, kv_cols], (x @ v.T)[:, kv_cols]], -1)
        torch.testing.assert_close(qkv(x), expected)

    w, b = torch.randn(HIDDEN, 12), torch.randn(HIDDEN)
    row = RowLinear(12, HIDDEN, True, method, "row")
    row.load("weight", w), row.load("bias", b)
    xr = torch.randn(3, 12)
    torch.testing.assert_close(row(xr[:, rank * 6 : rank * 6 + 6]), xr @ w.T + b)

    # Packed along the output features: a column layer takes its rank's packed columns.
    packed = ColumnLinear(HIDDEN, 8, False, PackedNoInputDim(), "packed")
    full = torch.randn(HIDDEN, 4)
    packed.load("packed", full)
    torch.testing.assert_close(packed.packed, full[:, rank * 2 : rank * 2 + 2], rtol=0, atol=0)
    # ...but a row layer cannot split what does not say its input dimension.
    with pytest.raises(WeightLoadError, match=r"row\.packed: .*packed_no_input_dim.*ParamLoading.input_dim"):
        RowLinear(12, 8, False, PackedNoInputDim(), "row").load("packed", torch.randn(12, 4))
    # Grouped along the input features: a row rank takes its groups; the gain is loaded whole.
    w, group_scale, gain = torch.randn(4, 16), torch.rand(4) + 0.5, torch.tensor([1.5])
    grouped = RowLinear(16, 4, False, GroupScaled(), "grouped")
    grouped.load("weight", w), grouped.load("group_scale", group_scale), grouped.load("gain", gain)
    xg = torch.randn(3, 16)
    torch.testing.assert_close(
        grouped(xg[:, rank * 8 : rank * 8 + 8]), (xg * group_scale.repeat_interleave(4) * 1.5) @ w.T
    )
    # 12 input features: a rank's 6 do not fall on the groups of 4.
    with pytest.raises(
        WeightLoadError,
        match=r"split\.group_scale: this rank's 6 input features at offset \d+ do not fall on the 4-feature groups",
    ):
        RowLinear(12, 4, False, GroupScaled(), "split").load("group_scale", torch.ones(3))

    # 70 ids padded to 128, 64 a rank: rank 1 holds ids 64..69 and 58 zero padding rows.
    table, ids = torch.randn(70, HIDDEN), torch.tensor([0, 5, 63, 64, 69, 3])
    embedding = VocabEmbedding(70, HIDDEN)
    embedding.load(table)
    assert (embedding.vocab_start, embedding.shard_rows, embedding.real_rows) == (rank * 64, 64, (64, 6)[rank])
    assert not embedding.weight[embedding.real_rows :].any()
    torch.testing.assert_close(embedding(ids), table[ids], rtol=0, atol=0)
    logits = embedding.logits(x)
    if rank == 0:
        torch.testing.assert_close(logits, x @ table.T)
    else:
        assert logits.shape == (3, 64)  # its own shard; only rank 0 returns logits
    with pytest.raises(WeightLoadError, match=r"lm_head\.weight: expected shape \(70, 16\), got \(64, 16\)"):
        embedding.load(table[:64], "lm_head.weight")

    # Shards at different rates: a column rank takes its rows of each, a row rank its groups of each row.
    a, b = torch.randn(4, 8), torch.randn(6, 4)  # 4 rows of 8 features; 6 rows of 2 groups of 4 in 2 elements
    mixed = MergedColumnLinear(8, [4, 6], False, FlatMixed(), "mixed", ["a", "b"])
    mixed.load("flat", a.reshape(-1), 0), mixed.load("flat", b, 1)  # flat or not: read as [rows, row elements]
    expected = torch.cat([a[rank * 2 : rank * 2 + 2].reshape(-1), b[rank * 3 : rank * 3 + 3].reshape(-1)])
    torch.testing.assert_close(mixed.flat, expected, rtol=0, atol=0)
    with pytest.raises(WeightLoadError, match=r"a\.flat: expected 4 rows of 8 input features in groups of 1"):
        mixed.load("flat", torch.zeros(28), 0)

    def fused_row(input_size: int, prefix: str) -> LinearBase:  # no model fuses row layers; the loader can
        per_rank = input_size // RANKS
        return LinearBase(
            per_rank, [3, 3], False, FlatMixed(), prefix, ["a", "b"],
            input_slice=(rank * per_rank, per_rank), full_input_size=input_size,
        )  # fmt: skip

    a, b = torch.randn(3, 8), torch.randn(3, 4)
    mixed_row = fused_row(8, "mixed_row")
    mixed_row.load("flat", a, 0), mixed_row.load("flat", b, 1)
    expected = torch.cat([a[:, rank * 4 : rank * 4 + 4].reshape(-1), b[:, rank * 2 : rank * 2 + 2].reshape(-1)])
    torch.testing.assert_close(mixed_row.flat, expected, rtol=0, atol=0)
    # 12 input features: a rank's 6 split the second shard's groups of 4.
    with pytest.raises(WeightLoadError, match=r"b\.flat: this rank's 6 input features at offset \d+ do not fall on"):
        fused_row(12, "split").load("flat", torch.zeros(3 * 6), 1)
    no_groups = ColumnLinear(HIDDEN, 4, False, method, "no_groups")
    no_groups.add_param("flat", torch.zeros(2), ParamLoading(shard_offsets=(0, 2)))
    with pytest.raises(WeightLoadError, match=r"no_groups\.flat: .*ParamLoading\.shard_groups"):
        no_groups.load("flat", torch.zeros(4))

    # An embedding kept in a method's format is vocab-parallel too: rank 1 holds ids 64..69 only.
    kept = VocabEmbedding(70, HIDDEN, KeptEmbedding(), "embed")
    assert kept.quantized.output_sizes == [(64, 6)[rank]] and kept.weight.numel() == 0
    kept.quantized.load("weight", table)
    torch.testing.assert_close(kept.quantized.weight, table[rank * 64 : rank * 64 + 64], rtol=0, atol=0)
    torch.testing.assert_close(kept(ids), table[ids], rtol=0, atol=0)
    logits = kept.logits(x)
    if rank == 0:
        torch.testing.assert_close(logits, x @ table.T)
    else:
        assert logits.shape == (3, 64)  # the padded shard, as a dense rank's
    # 20 ids padded to 64, 32 a rank: rank 1's shard is all padding, dense zero rows either way.
    small = VocabEmbedding(20, HIDDEN, KeptEmbedding(), "small")
    assert (small.quantized is None) == (rank == 1)
    if rank == 0:
        small.quantized.load("weight", table[:20])
    else:
        small.load(table[:20])
    torch.testing.assert_close(small(ids[ids < 20]), table[ids[ids < 20]], rtol=0, atol=0)

    with pytest.raises(ConfigError, match="tensor_parallel_size: odd has 7 output features, which 2 ranks"):
        ColumnLinear(HIDDEN, 7, False, method, "odd")
    with pytest.raises(ConfigError, match="tensor_parallel_size: qkv3 has 3 KV heads"):
        QKVLinear(HIDDEN, 6, 3, HEAD_DIM, False, method, "qkv3", ["q", "k", "v"])


def test_parallel_layers_on_two_gloo_ranks():
    mp.spawn(_rank_main, args=(_free_port(),), nprocs=RANKS, join=True)


def test_one_rank_is_the_plain_layer():
    assert (distributed.rank(), distributed.world_size()) == (0, 1)
    x, t = torch.randn(3, 5), torch.randn(4)
    assert distributed.all_reduce(t) is t and distributed.all_gather(t) is t
    row = RowLinear(5, 4, True, UnquantizedLinearMethod(), "row")
    w, b = torch.randn(4, 5), torch.randn(4)
    row.load("weight", w), row.load("bias", b)
    torch.testing.assert_close(row(x), torch.nn.functional.linear(x, w, b), rtol=0, atol=0)
