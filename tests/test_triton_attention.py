"""The Triton attention backend in the engine on a CPU: never chosen by ``auto``, refused with
the platform named when forced without the interpreter, and (under ``TRITON_INTERPRET=1``)
the same greedy tokens as HF transformers, batched, with chunked prefill and with preemption
(on a GPU, the same parity runs compiled)."""

import pytest
import torch
import transformers

from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError
from kvserve.testing.hf_models import build_tiny_model

pytest.importorskip("kvserve_attention_triton")

PROMPTS = ["Paris is the capital of", "0123456789", "Paged attention stores keys and values in fixed size blocks."]
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny Llama with head size 64 (one the Triton backend serves), and HF's greedy tokens."""
    path = build_tiny_model("llama", tmp_path_factory.mktemp("llama64"), head_dim=64)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    expected = []
    for ids in prompt_ids:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS)
        expected.append(out[0, len(ids) :].tolist())
    return path, prompt_ids, expected


def test_auto_picks_cpu_even_under_the_interpreter(tiny_llama, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    llm = LLM(str(tiny_llama[0]), max_model_len=64, num_kv_blocks=16)
    assert llm.engine.runner.backend.name == "cpu"


def test_forcing_triton_on_cpu_without_the_interpreter_names_the_platform(tiny_llama, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match=r"triton: platform 'cpu': Triton needs a GPU platform \(cuda\)"):
        LLM(str(tiny_llama[0]), attention_backend="triton", max_model_len=64, num_kv_blocks=16)


@pytest.mark.parametrize(
    "engine_args",
    [
        {"max_model_len": 64, "num_kv_blocks": 16},
        {"max_model_len": 64, "num_kv_blocks": 16, "max_num_batched_tokens": 7},
        {"max_model_len": 48, "num_kv_blocks": 4},
    ],
    ids=["batched", "chunked-prefill", "preemption"],
)
def test_greedy_tokens_match_hf_under_the_interpreter(tiny_llama, engine_args):
    """On a CPU, conftest.py switched the interpreter on before triton was imported."""
    path, prompt_ids, expected = tiny_llama
    llm = LLM(str(path), attention_backend="triton", block_size=16, **engine_args)
    assert llm.engine.runner.backend.name == "triton"
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS)
    assert [o.outputs[0].token_ids for o in llm.generate(prompt_ids, greedy, use_tqdm=False)] == expected
    if engine_args["num_kv_blocks"] == 4:
        assert llm.engine.num_preemptions > 0, "the tiny KV cache should have forced preemption"
