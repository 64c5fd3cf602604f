import dataclasses

import pytest
import torch

from kvserve.interfaces import AttentionSpec
from kvserve.testing.attention_reference import make_paged_case, reference_attention, write_past_kv
from kvserve_attention_cpu.backend import CpuAttentionBackend

MIXED = [(0, 7), (5, 1), (20, 1), (3, 9), (40, 1), (0, 1)]  # prefills, chunked prefills, decodes


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_mixed_batch_matches_reference(heads, kv_heads, block_size):
    head_dim, num_blocks = 32, 64
    case = make_paged_case(MIXED, heads, kv_heads, head_dim, block_size, num_blocks, seed=block_size + heads)
    spec = AttentionSpec(heads, kv_heads, head_dim, torch.float32, block_size, torch.device("cpu"))
    backend = CpuAttentionBackend(spec)
    cache = torch.zeros(CpuAttentionBackend.kv_cache_shape(num_blocks, block_size, kv_heads, head_dim))
    past = dataclasses.replace(case.batch)

    def write(k, v, slots):
        past.slot_mapping = slots
        backend.write_kv(cache, k, v, backend.build_metadata(past))

    write_past_kv(case, write)
    metadata = backend.build_metadata(case.batch)
    backend.write_kv(cache, case.key, case.value, metadata)
    out = backend.forward(case.query, cache, metadata, head_dim**-0.5)
    torch.testing.assert_close(out.double(), reference_attention(case, head_dim**-0.5), atol=1e-5, rtol=1e-5)
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool)
    untouched[case.batch.slot_mapping] = False
    for table_row, (seq_len) in zip(case.batch.block_tables, case.batch.seq_lens_host):
        for p in range(seq_len):
            untouched[table_row[p // block_size] * block_size + p % block_size] = False
    assert cache[:, :].flatten(1, 2)[:, untouched].abs().sum() == 0, "write_kv touched slots outside slot_mapping"
