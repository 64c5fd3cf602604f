"""LoRA bookkeeping without a model plugin: the step's grouping of tokens into segments, the host
cache's LRU order (adapters in use never leave), slots filled with the adapter's A and scaled B, a
tensor-parallel rank's slots holding its shard."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from kvserve.layers.linear import ColumnLinear, LinearBase, QKVLinear, UnquantizedLinearMethod
from kvserve.lora import LoRARequest
from kvserve.lora.layers import LoRASlots, SlotLoad, plan_lora_batch
from kvserve.lora.manager import BASE_SLOT, LoRAManager
from kvserve.lora.torch_kernel import TorchLoRAKernel
from kvserve.request import Request
from kvserve.sampling_params import SamplingParams

HIDDEN = 8


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        method = UnquantizedLinearMethod()
        shards = [f"model.attn.{name}" for name in ("q_proj", "k_proj", "v_proj")]
        self.qkv = QKVLinear(HIDDEN, 2, 1, 4, False, method, "model.attn.qkv_proj", shards)
        self.up = ColumnLinear(HIDDEN, 6, False, method, "model.mlp.up_proj")


def _adapter(path, seed, modules, rank=2, alpha=4.0):
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": alpha}))
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for module, out in modules.items():
        weights[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, HIDDEN, generator=gen)
        weights[f"base_model.model.{module}.lora_B.weight"] = torch.randn(out, rank, generator=gen)
    save_file(weights, path / "adapter_model.safetensors")
    return LoRARequest(path.name, seed, str(path))


@pytest.fixture
def adapters(tmp_path):
    return [
        _adapter(tmp_path / "a", 1, {"model.attn.k_proj": 4}),
        _adapter(tmp_path / "b", 2, {"model.mlp.up_proj": 6, "model.attn.q_proj": 8}),
        _adapter(tmp_path / "c", 3, {"model.attn.v_proj": 4}),
    ]


def _manager(max_loras=2, max_cached=2):
    return LoRAManager(_slots(max_loras).targets, max_loras, max_rank=4, max_cached=max_cached)


def _slots(max_loras=2):
    return LoRASlots(TwoLayers(), TorchLoRAKernel(), max_loras, max_rank=4)


def _request(request_id, lora_request):
    return Request(request_id, [1, 2], SamplingParams(), lora_request=lora_request)


def test_segments_are_the_runs_of_one_slot():
    batch = plan_lora_batch(np.array([-1, 0, 0, 0, 1, -1, 1, 2, 2]), torch.device("cpu"))
    assert batch.segments == ((1, 4, 0), (4, 5, 1), (6, 7, 1), (7, 9, 2))
    assert batch.single_rows.tolist() == [4, 6] and batch.single_slots.tolist() == [1, 1]
    assert plan_lora_batch(np.array([-1, -1]), torch.device("cpu")) is None, "a base-only step plans nothing"


def test_idle_adapters_leave_least_recently_used_first_and_used_ones_stay(adapters):
    a, b, c = adapters
    manager = _manager(max_cached=1)
    manager.acquire("r1", a)
    manager.load(b)
    assert list(manager.cache) == [1, 2], "a is in use, b was loaded last: both stay"
    manager.load(c)
    assert list(manager.cache) == [1, 3], "b, idle and least recently used, left"
    manager.release("r1")
    assert list(manager.cache) == [3]
    manager.release("r1")  # a second release of one request changes nothing
    assert not manager.in_use


def test_slots_hold_a_and_the_scaled_b_of_each_slice(adapters):
    a, b, _ = adapters
    manager, slots = _manager(), _slots()
    requests = [_request("r1", b), _request("r2", None), _request("r3", a)]
    for request in requests:
        if request.lora_request is not None:
            manager.acquire(request.request_id, request.lora_request)
    loads = manager.activate(requests)
    assert manager.activate(requests) == [], "adapters already in slots are not loaded again"
    slots.load(loads)
    slot_b, slot_a = manager.slot_of(requests[0]), manager.slot_of(requests[2])
    assert manager.slot_of(requests[1]) == BASE_SLOT and {slot_a, slot_b} == {0, 1}
    qkv, up = slots.layers[0][1], slots.layers[1][1]
    loaded = manager.cache[2].modules
    q_a, q_b = loaded["model.attn.q_proj"]
    assert torch.equal(qkv.lora_a[slot_b, :, :2], q_a.t()) and torch.equal(qkv.lora_b[0][slot_b, :2], q_b.t())
    assert not qkv.lora_a[slot_b, :, 4:].any() and not qkv.lora_b[1][slot_b].any(), "b leaves k and v alone"
    assert torch.equal(up.lora_b[0][slot_b, :2], loaded["model.mlp.up_proj"][1].t())
    assert manager.cache[2].scaling == 2.0  # lora_alpha / r


def test_a_step_never_takes_a_slot_from_an_adapter_it_runs(adapters):
    a, b, c = adapters
    manager = _manager(max_loras=2, max_cached=3)
    first = [_request("r1", a), _request("r2", b)]
    for request in first:
        manager.acquire(request.request_id, request.lora_request)
    manager.activate(first)
    slot_a = manager.slot_of(first[0])
    manager.acquire("r3", c)
    manager.activate([first[0], _request("r3", c)])
    assert manager.slot_of(first[0]) == slot_a, "a stays where it is"
    assert manager.slots[1 - slot_a] == 3, "c takes b's slot: b does not run in this step"
    with pytest.raises(RuntimeError, match="3 distinct LoRA adapters but there are 2 slots"):
        manager.activate([_request("x", a), _request("y", b), _request("z", c)])


def test_a_step_given_as_a_generator_keeps_its_adapters_slots(adapters):
    a, b, c = adapters  # the engine passes its scheduled requests as a generator: read once
    manager = _manager(max_loras=2, max_cached=3)
    first = [_request("r1", a), _request("r2", b)]
    for request in first:
        manager.acquire(request.request_id, request.lora_request)
    manager.activate(request for request in first)
    slot_a = manager.slot_of(first[0])
    manager.acquire("r3", c)
    manager.activate(request for request in [first[0], _request("r3", c)])
    assert manager.slot_of(first[0]) == slot_a and manager.slots[1 - slot_a] == 3


def test_a_ranks_slots_hold_its_shard_and_row_shards_sum_to_the_whole(tmp_path):
    """Two ranks' shards, built as tensor parallelism builds them: a column layer's slots hold all of A
    and the rank's output features of B, a row layer's the rank's input features of A and all of B;
    adapters are checked against the whole layer; the ranks' row terms sum to ``x A B``."""
    method = UnquantizedLinearMethod()
    up, down = "model.mlp.up_proj", "model.mlp.down_proj"
    gen = torch.Generator().manual_seed(0)
    weights = {up: (torch.randn(2, HIDDEN, generator=gen), torch.randn(6, 2, generator=gen))}
    weights[down] = (torch.randn(2, 6, generator=gen), torch.randn(HIDDEN, 2, generator=gen))
    x = torch.randn(3, 6, generator=gen)
    partial_sum = torch.zeros(3, HIDDEN)
    for rank in range(2):
        model = torch.nn.Module()
        model.up = LinearBase(HIDDEN, [3], False, method, up, shard_slices=[(3 * rank, 3)], full_output_sizes=[6])
        model.down = LinearBase(3, [HIDDEN], False, method, down, input_slice=(3 * rank, 3), full_input_size=6)
        slots = LoRASlots(model, TorchLoRAKernel(), max_loras=1, max_rank=4)
        assert slots.targets == {up: (HIDDEN, 6), down: (6, HIDDEN)}, "adapters are checked against whole layers"
        slots.load([SlotLoad(0, weights)])
        (_, up_lora), (_, down_lora) = slots.layers
        assert torch.equal(up_lora.lora_a[0, :, :2], weights[up][0].t())
        assert torch.equal(up_lora.lora_b[0][0, :2], weights[up][1][3 * rank : 3 * rank + 3].t())
        assert torch.equal(down_lora.lora_a[0, :, :2], weights[down][0][:, 3 * rank : 3 * rank + 3].t())
        assert torch.equal(down_lora.lora_b[0][0, :2], weights[down][1].t())
        partial_sum += x[:, 3 * rank : 3 * rank + 3] @ down_lora.lora_a[0] @ down_lora.lora_b[0][0]
    a, b = weights[down]
    torch.testing.assert_close(partial_sum, x @ a.t() @ b.t())
