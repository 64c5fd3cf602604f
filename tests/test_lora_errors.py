"""LoRA's refusals: each bad adapter, request or configuration is refused with an error naming the
problem, before anything is queued, and the engine goes on serving (no request left, no KV block held).

Adapters are made with the real ``peft`` library where it can make them (DoRA, trained biases,
``modules_to_save``, a rank too high, a target the LoRA layers lack); files it would never write
(a corrupt or non-LoRA weight file, a wrong shape, an unknown module) are written by hand.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from kvserve import LLM, SamplingParams
from kvserve.config import EngineConfig
from kvserve.engine.validation import check_request
from kvserve.errors import ConfigError
from kvserve.lora import LoRARequest
from kvserve.testing.hf_models import build_lora_adapter, build_tiny_model

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13]
WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("lora-errors-base"))


@pytest.fixture(scope="module")
def llm(base):
    return LLM(str(base), dtype="float32", num_kv_blocks=64, enable_lora=True, max_lora_rank=8, max_loras=2)


@pytest.fixture(scope="module")
def good(base, tmp_path_factory):
    """Three valid adapters of rank 8 or less."""
    root = tmp_path_factory.mktemp("lora-good")
    return [
        build_lora_adapter(base, root / f"good{i}", i, r=2 + 3 * i, lora_alpha=8, target_modules=targets)
        for i, targets in enumerate([["q_proj", "v_proj"], ["o_proj", "down_proj"], ["gate_proj", "k_proj"]])
    ]


def _peft(fields):
    return lambda base, good, path: build_lora_adapter(base, path, 7, **fields)


def _edited(edit):
    """A copy of the first good adapter whose weights ``edit`` changes (a dict of tensors, in place)."""

    def make(base, good, path):
        shutil.copytree(good[0], path)
        weights = load_file(path / WEIGHTS)
        edit(weights)
        save_file(weights, path / WEIGHTS)
        return path

    return make


def _write(name, data):
    def make(base, good, path):
        shutil.copytree(good[0], path)
        (path / name).write_bytes(data)
        return path

    return make


def _config(**fields):
    def make(base, good, path):
        shutil.copytree(good[0], path)
        config = json.loads((path / "adapter_config.json").read_text())
        (path / "adapter_config.json").write_text(json.dumps({**config, **fields}))
        return path

    return make


A_KEY = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
BAD_ADAPTERS = {
    "missing": (lambda base, good, path: path / "nowhere", "no such directory"),
    "no-config": (lambda base, good, path: path.mkdir() or path, "no adapter_config.json"),
    "dora": (_peft({"r": 4, "target_modules": ["q_proj"], "use_dora": True}), "DoRA adapters (use_dora)"),
    "bias": (_peft({"r": 4, "target_modules": ["q_proj"], "bias": "lora_only"}), "bias='lora_only'"),
    "modules-to-save": (
        _peft({"r": 4, "target_modules": ["q_proj"], "modules_to_save": ["lm_head"]}),
        "modules_to_save",
    ),
    "rank-too-high": (_peft({"r": 16, "target_modules": ["q_proj"]}), "r=16 exceeds max_lora_rank=8"),
    "lm-head": (_peft({"r": 4, "target_modules": ["lm_head"]}), "module 'lm_head' is not a linear layer"),
    "not-lora": (_config(peft_type="PREFIX_TUNING"), "not a LoRA config"),
    "wrong-shape": (
        _edited(lambda w: w.__setitem__(A_KEY, torch.ones(2, 63))),
        "module 'model.layers.0.self_attn.q_proj' has lora_A (2, 63)",
    ),
    "unknown-module": (
        _edited(lambda w: w.update({A_KEY.replace("q_proj", "fc9"): torch.ones(2, 64)})),
        "module 'model.layers.0.self_attn.fc9' is not a linear layer",
    ),
    "non-lora-tensor": (
        _edited(lambda w: w.update({"model.embed_tokens.weight": torch.ones(4, 4)})),
        "'model.embed_tokens.weight' is not a LoRA linear weight",
    ),
    "corrupt": (_write(WEIGHTS, b"\x00\x01 not safetensors"), "cannot read adapter_model.safetensors"),
}


def _assert_idle(llm):
    engine = llm.engine
    assert not engine.has_unfinished_requests()
    stats = engine.kv_cache_manager.stats()
    assert stats.num_free_blocks == stats.num_blocks, "a refused request left KV blocks held"
    assert not engine.lora.users


@pytest.mark.parametrize("case", sorted(BAD_ADAPTERS))
def test_bad_adapter_is_refused_by_name_and_the_engine_serves_on(llm, base, good, tmp_path, case):
    make, words = BAD_ADAPTERS[case]
    path = make(base, good, tmp_path / case)
    bad = LoRARequest(f"bad-{case}", 100, str(path))
    fine = LoRARequest("good0", 1, str(good[0]))
    with pytest.raises(ValueError, match=f"LoRA adapter 'bad-{case}'.*{re.escape(words)}"):
        llm.generate([PROMPT, PROMPT], PARAMS, use_tqdm=False, lora_request=[fine, bad])
    _assert_idle(llm)
    outputs = llm.generate([PROMPT, PROMPT], PARAMS, use_tqdm=False, lora_request=[fine, None])
    assert all(len(o.outputs[0].token_ids) == 4 for o in outputs)
    _assert_idle(llm)


def test_an_id_or_a_name_names_one_adapter(llm, good):
    first = LoRARequest("first", 11, str(good[0]))
    llm.generate(PROMPT, PARAMS, use_tqdm=False, lora_request=first)
    with pytest.raises(ValueError, match="lora_int_id 11 is already adapter 'first'"):
        llm.generate(PROMPT, PARAMS, use_tqdm=False, lora_request=LoRARequest("second", 11, str(good[1])))
    with pytest.raises(ValueError, match="lora_name is already adapter 'first'"):
        llm.generate(PROMPT, PARAMS, use_tqdm=False, lora_request=LoRARequest("first", 12, str(good[1])))
    _assert_idle(llm)


def test_more_adapters_than_slots_take_turns(llm, good):
    """Three adapters, two slots: no step runs more than two, and each request's tokens are those it
    gets alone."""
    requests = [LoRARequest(f"turn{i}", 20 + i, str(path)) for i, path in enumerate(good)]
    alone = [llm.generate(PROMPT, PARAMS, use_tqdm=False, lora_request=r)[0].outputs[0].token_ids for r in requests]
    seen: list[set[LoRARequest]] = []
    activate = llm.engine.lora.activate

    def recording(scheduled):  # observes each step's adapters, then activates them as the engine would
        scheduled = list(scheduled)
        seen.append({r.lora_request for r in scheduled if r.lora_request is not None})
        return activate(scheduled)

    llm.engine.lora.activate = recording
    try:
        outputs = llm.generate([PROMPT] * 6, PARAMS, use_tqdm=False, lora_request=requests * 2)
    finally:
        del llm.engine.lora.activate
    assert [o.outputs[0].token_ids for o in outputs] == alone * 2
    assert max(map(len, seen)) == 2, seen
    _assert_idle(llm)


def test_lora_request_without_enable_lora_is_refused():
    with pytest.raises(ValueError, match="started without LoRA; start it with enable_lora=True"):
        check_request(
            PROMPT, PARAMS, vocab_size=384, max_model_len=64, max_n=1, tokenizer=None,
            lora_request=LoRARequest("a", 1, "/a"), enable_lora=False,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"optimization_level": 1}, "enable_lora with optimization_level 1 (compiled) is not supported yet"),
        ({"max_loras": 4, "max_cpu_loras": 2}, "lora.max_cpu_loras: Value error, must be at least max_loras (4)"),
    ],
)
def test_unsupported_combinations_are_refused_at_start(fields, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        EngineConfig.from_flat(enable_lora=True, **fields)


@pytest.mark.parametrize("field", [{"lora_int_id": 0}, {"lora_name": ""}, {"lora_path": ""}])
def test_lora_request_fields_are_checked(field):
    with pytest.raises(ValueError, match="lora_request"):
        LoRARequest(**{"lora_name": "a", "lora_int_id": 1, "lora_path": "/a", **field})
