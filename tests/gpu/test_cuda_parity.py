"""Greedy decoding on CUDA with each GPU attention backend, and over two GPUs with tensor
parallelism, agrees with HF transformers (run by scripts/gpu-check; skipped without a CUDA
device, the tensor-parallel case without two).

In fp16 two backends may break a near-tie differently, so "agrees" is checked the way that
survives rounding: HF, teacher-forced on kvserve's tokens, must rank each of them within a few
rounding errors of its own best logit; the share of tokens identical to HF's own greedy output
is printed alongside.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError
from kvserve.loader.default_model import embedded_gguf_path
from kvserve.testing.hf_models import build_tiny_model

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check runs this on a GPU machine)"
)

BACKENDS = ("triton", "flash_attn", "flashinfer")
PROMPTS = [
    "Paris is the capital of",
    "The quick brown fox jumps over the lazy dog. Continuous batching admits new requests",
    "0123456789",
    "Paged attention stores keys and values in fixed size blocks.",
]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A tiny Llama with head size 64 (every GPU backend has kernels for it) and GQA."""
    path = tmp_path_factory.mktemp("tiny-llama")
    return build_tiny_model("llama", path, hidden_size=256, num_attention_heads=4, num_key_value_heads=2)


def hf_model(path: str | None):
    """The same checkpoint in HF transformers, fp16 on CUDA (None: the embedded SmolLM2 GGUF)."""
    if path is None:
        gguf = embedded_gguf_path()
        model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float16)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16)
    return model.cuda().eval()


def greedy_margins(model, prompt: list[int], tokens: list[int]) -> tuple[torch.Tensor, float]:
    """HF's best logit minus its logit of each of ``tokens``, teacher-forced after ``prompt``, and
    the largest logit magnitude (what fp16 rounding errors scale with)."""
    ids = torch.tensor([prompt + tokens[:-1]], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 :].float()
    chosen = logits.gather(1, torch.tensor(tokens, device="cuda")[:, None])[:, 0]
    return (logits.max(-1).values - chosen).cpu(), logits.abs().max().item()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("model_name", ["tiny-llama", "smollm2"])
def test_greedy_tokens_agree_with_hf_on_cuda(backend, model_name, tiny_llama, capsys):
    path = str(tiny_llama) if model_name == "tiny-llama" else None
    try:
        llm = LLM(path, platform="cuda", attention_backend=backend, dtype="float16", max_model_len=256)
    except ConfigError as error:  # the backend's own reasons (library missing, GPU too old ...)
        pytest.skip(f"{backend} cannot run here: {error}")
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS), use_tqdm=False)
    check_against_hf(path, prompts, [o.outputs[0].token_ids for o in outputs], f"{backend}/{model_name}", capsys)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism on CUDA needs 2 GPUs (one per rank)")
def test_two_gpu_ranks_agree_with_hf(tiny_llama, capsys):
    # Rank r of the multiprocess executor drives cuda:r; the all-reduces run over NCCL.
    llm = LLM(str(tiny_llama), platform="cuda", dtype="float16", max_model_len=256, tensor_parallel_size=2)
    try:
        prompts = [llm.get_tokenizer().encode(p) for p in PROMPTS]
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS), use_tqdm=False)
    finally:
        llm.engine.shutdown()
    check_against_hf(str(tiny_llama), prompts, [o.outputs[0].token_ids for o in outputs], "TP=2/tiny-llama", capsys)


def check_against_hf(path: str | None, prompts: list[list[int]], ours: list[list[int]], label: str, capsys) -> None:
    """HF ranks each of kvserve's greedy tokens within fp16 rounding of its best; prints how many
    are identical to HF's own greedy output."""
    model = hf_model(path)
    same = total = 0
    for prompt, tokens in zip(prompts, ours):
        margins, magnitude = greedy_margins(model, prompt, tokens)
        assert (margins <= 0.05 + 0.01 * magnitude).all(), (
            f"{label}: HF ranks kvserve's token {int(margins.argmax())} of {tokens} "
            f"{margins.max():.3f} below its best (prompt {prompt})"
        )
        with torch.no_grad():
            hf = model.generate(torch.tensor([prompt], device="cuda"), do_sample=False, max_new_tokens=len(tokens))
        hf_tokens = hf[0, len(prompt) :].tolist()
        same += sum(a == b for a, b in zip(tokens, hf_tokens))
        total += len(tokens)
    with capsys.disabled():
        print(f"\n{label}: {same}/{total} greedy tokens identical to HF fp16 generate")
