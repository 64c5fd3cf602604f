"""Multi-LoRA through ``LLM``: adapters made with the real ``peft`` library on tiny local HF models,
run in one batch mixed with the base model and each other, against ``peft``'s own ``PeftModel``.

Each adapter's A and B are random and non-zero (PEFT starts B at zero, which would test nothing);
ranks, target sets and rsLoRA differ between them. Greedy float32 tokens must be identical and the
chosen tokens' logprobs within 1e-3.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
import transformers

from kvserve import LLM, SamplingParams
from kvserve.config import EngineConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.loader.default_model import embedded_gguf_path
from kvserve.lora import LoRARequest
from kvserve.testing.hf_models import build_lora_adapter, build_tiny_model
from kvserve.testing.lora_parity import assert_rows_match, generate_mixed, peft_rows

NEW_TOKENS = 6
PROMPTS = [
    "The quick brown fox",
    "Paris is the capital of",
    "Paged attention stores keys and values in fixed size blocks, and continuous batching",
]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]
ADAPTERS = {  # name -> LoraConfig fields
    "qv-r8": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    "all-r4-rslora": {"r": 4, "lora_alpha": 8, "target_modules": ATTENTION + MLP, "use_rslora": True},
    "mlp-r16": {"r": 16, "lora_alpha": 8, "target_modules": ["up_proj", "down_proj"]},
}
BASES = {
    "llama": ("llama", {}),
    "gemma3": ("gemma3_text", {"num_hidden_layers": 3, "head_dim": 32, "sliding_window": 6}),
}
ENGINE = {"dtype": "float32", "max_model_len": 128, "num_kv_blocks": 96, "max_loras": 4, "max_lora_rank": 16}


@pytest.fixture(scope="module", params=sorted(BASES))
def setup(request, tmp_path_factory):
    """The base model, its adapters and the HF/PEFT reference of every (adapter or base, prompt)."""
    arch, overrides = BASES[request.param]
    root = tmp_path_factory.mktemp(f"lora-{request.param}")
    base = build_tiny_model(arch, root / "base", **overrides)
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    adapters = {
        name: build_lora_adapter(base, root / name, seed, **fields)
        for seed, (name, fields) in enumerate(ADAPTERS.items())
    }
    return base, adapters, prompt_ids, peft_rows(base, prompt_ids, adapters, NEW_TOKENS)


def lora_requests(adapters):
    return {name: LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(adapters.items())}


def test_mixed_batch_matches_peft(setup):
    """Every adapter and the base model, each on every prompt, in one generate call (one batch)."""
    base, adapters, prompt_ids, reference = setup
    llm = LLM(str(base), enable_lora=True, **ENGINE)
    assert_rows_match(generate_mixed(llm, prompt_ids, adapters, NEW_TOKENS), reference)


def test_async_llm_runs_adapters_and_refuses_a_bad_one(setup, tmp_path):
    """``AsyncLLM.generate(..., lora_request=...)``: PeftModel's tokens; an adapter the engine cannot read
    fails its request only, naming the problem, and the engine serves on."""
    base, adapters, prompt_ids, reference = setup
    llm = AsyncLLM.from_config(EngineConfig.from_flat(model=str(base), enable_lora=True, **ENGINE))
    requests = lora_requests(adapters)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
    missing = LoRARequest("missing", 99, str(tmp_path / "missing"))

    async def run(request_id, prompt, lora_request):
        async for output in llm.generate(prompt, params, request_id, lora_request=lora_request):
            last = output
        return last.outputs[0].token_ids

    async def main():
        jobs = [run(f"r{i}-{name}", prompt_ids[i], requests[name]) for i in range(2) for name in adapters]
        got = await asyncio.gather(*jobs)
        with pytest.raises(Exception, match="LoRA adapter 'missing'.*no such directory"):
            await run("bad", prompt_ids[0], missing)
        again = await run("again", prompt_ids[0], requests["qv-r8"])
        return got, again

    try:
        got, again = asyncio.run(main())
    finally:
        llm.shutdown()
    assert got == [reference[name, i][0] for i in range(2) for name in adapters]
    assert again == reference["qv-r8", 0][0]


def test_embedded_smollm2_with_peft_adapters(tmp_path):
    """The embedded SmolLM2-135M (its GGUF dequantized: quantization='none'), the base model and two
    adapters in one batch, against transformers loading the same GGUF under PeftModel."""
    gguf = embedded_gguf_path()
    hf_dir = tmp_path / "smollm2"
    loaded = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The same (dequantized) weights as a plain HF directory, for peft and the reference: transformers
    # refuses to save a model it loaded from GGUF, so a fresh one of its config takes them.
    config = loaded.config
    del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(hf_dir)
    llm = LLM(dtype="float32", quantization="none", max_model_len=256, enable_lora=True, max_loras=2)
    tokenizer = llm.get_tokenizer()
    tokenizer.save_pretrained(hf_dir)
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS[:2]]
    adapters = {
        "qv": build_lora_adapter(
            hf_dir, tmp_path / "qv", 1, scale=0.1, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]
        ),
        "all": build_lora_adapter(
            hf_dir,
            tmp_path / "all",
            2,
            scale=0.05,
            r=16,
            lora_alpha=16,
            target_modules=ATTENTION + MLP,
            use_rslora=True,
        ),
    }
    assert_rows_match(
        generate_mixed(llm, prompt_ids, adapters, NEW_TOKENS), peft_rows(hf_dir, prompt_ids, adapters, NEW_TOKENS)
    )


ADDED_TOKEN = "<sql>"
ADAPTER_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}<sql>"


def test_an_adapter_tokenizer_serves_its_requests_text(tmp_path):
    """An adapter that ships a tokenizer (an added token, its own chat template): its requests' text
    prompts, chat rendering and ``bad_words`` go through that tokenizer, in ``LLM`` and ``AsyncLLM``;
    the base model's requests keep the model's."""
    # A vocabulary larger than the tokenizer's: the added token has a row of its own.
    base = build_tiny_model("llama", tmp_path / "base", vocab_size=512)
    folder = build_lora_adapter(base, tmp_path / "tok", 1, r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    tokenizer.add_tokens([ADDED_TOKEN])
    tokenizer.chat_template = ADAPTER_TEMPLATE
    tokenizer.save_pretrained(folder)
    added = tokenizer.convert_tokens_to_ids(ADDED_TOKEN)
    adapter = LoRARequest("tok", 1, str(folder))
    prompt = f"Paris {ADDED_TOKEN} is"
    llm = LLM(str(base), enable_lora=True, **ENGINE)
    greedy = SamplingParams(temperature=0, max_tokens=2)
    with_adapter, without = llm.generate([prompt, prompt], greedy, use_tqdm=False, lora_request=[adapter, None])
    assert with_adapter.prompt_token_ids == tokenizer.encode(prompt) and added in with_adapter.prompt_token_ids
    assert added not in without.prompt_token_ids
    [chat] = llm.chat([{"role": "user", "content": "hi"}], greedy, use_tqdm=False, lora_request=adapter)
    assert chat.prompt == "[user]hi<sql>" and chat.prompt_token_ids[-1] == added
    # The added token as a bad word: forced by logit_bias, yet never emitted.
    forced = SamplingParams(temperature=0, max_tokens=3, logit_bias={added: 100.0})
    assert llm.generate(prompt, forced, use_tqdm=False, lora_request=adapter)[0].outputs[0].token_ids == [added] * 3
    banned = forced.model_copy(update={"bad_words": [ADDED_TOKEN]})
    assert added not in llm.generate(prompt, banned, use_tqdm=False, lora_request=adapter)[0].outputs[0].token_ids
    llm.engine.shutdown()

    async_llm = AsyncLLM.from_config(EngineConfig.from_flat(model=str(base), enable_lora=True, **ENGINE))

    async def first_prompt_ids(lora_request):
        async for output in async_llm.generate(prompt, greedy, f"r-{lora_request}", lora_request=lora_request):
            return output.prompt_token_ids

    try:
        assert asyncio.run(first_prompt_ids(adapter)) == with_adapter.prompt_token_ids
        assert asyncio.run(first_prompt_ids(None)) == without.prompt_token_ids
    finally:
        async_llm.shutdown()
