"""Acceptance checks of a quantized checkpoint: kvserve against HF transformers running the
dequantized weights, and the engine's resident weight bytes against the format's size."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

PROMPTS = [
    "Paris is the capital of",
    "The quick brown fox jumps over the lazy dog. Continuous batching admits new requests",
    "0123456789",
    "Paged attention stores keys and values in fixed size blocks.",
]
NEW_TOKENS = 32


def hf_greedy(model: Any, prompt_ids: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[tuple[list, list]]:
    """``(tokens, logprobs of those tokens)`` per prompt from HF ``generate`` (greedy, raw logits)."""
    results = []
    for ids in prompt_ids:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
        tokens = out.sequences[0, len(ids) :].tolist()
        logprobs = [float(torch.log_softmax(s[0].double(), -1)[t]) for s, t in zip(out.logits, tokens, strict=True)]
        results.append((tokens, logprobs))
    return results


def kvserve_greedy(llm: Any, prompt_ids: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[tuple[list, list]]:
    """``(tokens, logprobs of those tokens)`` per prompt from ``kvserve.LLM`` (greedy)."""
    from kvserve import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, min_tokens=new_tokens, logprobs=0)
    results = []
    for output in llm.generate(prompt_ids, params, use_tqdm=False):
        completion = output.outputs[0]
        logprobs = [entry[t].logprob for entry, t in zip(completion.logprobs, completion.token_ids, strict=True)]
        results.append((completion.token_ids, logprobs))
    return results


def assert_matches_reference(got, expected, min_matching: int = 28, logprob_bound: float = 1e-3) -> list[int]:
    """Every prompt's greedy tokens agree with the reference's for at least ``min_matching``
    leading tokens, and the logprobs of those tokens differ by at most ``logprob_bound``.
    Returns the matching lengths."""
    lengths = []
    for index, ((tokens, logprobs), (ref_tokens, ref_logprobs)) in enumerate(zip(got, expected, strict=True)):
        same = next(
            (i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), min(len(tokens), len(ref_tokens))
        )
        assert same >= min_matching, (
            f"prompt {index}: only {same} of {len(ref_tokens)} greedy tokens match the reference "
            f"(need {min_matching}); kvserve {tokens}, reference {ref_tokens}"
        )
        worst = max(abs(a - b) for a, b in zip(logprobs[:same], ref_logprobs[:same]))
        assert worst <= logprob_bound, (
            f"prompt {index}: a token's logprob differs from the reference by {worst:.3g} (bound {logprob_bound})"
        )
        lengths.append(same)
    return lengths


LORA_ADAPTERS = {  # name -> LoraConfig fields: every projection, a rank below max_lora_rank, rsLoRA
    "qv-r8": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    "all-r4-rslora": {
        "r": 4,
        "lora_alpha": 8,
        "use_rslora": True,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    },
}


def dense_checkpoint(reference: Any, base: Path, out: Path) -> Path:
    """``base`` (an HF checkpoint directory: config, tokenizer) with the weights of ``reference``, an HF
    model of its architecture holding the weights a quantized checkpoint encodes: the fp32 model that
    ``peft`` adapters are made over and ``PeftModel`` runs."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(base, out)
    state = reference.state_dict()
    weights = {name: state[name].float().contiguous() for name in load_file(Path(base) / "model.safetensors")}
    save_file(weights, Path(out) / "model.safetensors", metadata={"format": "pt"})
    return Path(out)


def assert_lora_matches_peft(
    llm: Any, dense: Path, prompt_ids: list[list[int]], adapter_root: Path, logprob_bound: float = 1e-3
) -> None:
    """Adapters made with the real ``peft`` over ``dense`` (:data:`LORA_ADAPTERS`, A and B random),
    run by ``llm`` (the quantized checkpoint, ``enable_lora``) mixed with base rows in one batch: every
    row's :data:`NEW_TOKENS` greedy tokens identical to HF ``generate`` over ``dense`` (under
    ``PeftModel`` for an adapter's), their logprobs within ``logprob_bound``."""
    from kvserve.testing import hf_models, lora_parity

    adapters = {
        name: hf_models.build_lora_adapter(dense, Path(adapter_root) / name, seed, scale=0.1, **fields)
        for seed, (name, fields) in enumerate(LORA_ADAPTERS.items())
    }
    lora_parity.assert_rows_match(
        lora_parity.generate_mixed(llm, prompt_ids, adapters, NEW_TOKENS),
        lora_parity.peft_rows(dense, prompt_ids, adapters, NEW_TOKENS),
        logprob_bound,
    )


def linear_bytes(model: torch.nn.Module, checkpoint: Path) -> tuple[int, int]:
    """``(resident bytes of the model's linear layers, bytes of their tensors in the checkpoint)``."""
    from safetensors import safe_open

    from kvserve.layers import LinearBase

    resident, prefixes = 0, set()
    for module in model.modules():
        if isinstance(module, LinearBase):
            resident += sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])
            prefixes.update(module.shard_prefixes)
    stored = 0
    for file in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name.rpartition(".")[0] in prefixes:
                    tensor = f.get_slice(name)
                    shape, dtype = tensor.get_shape(), tensor.get_dtype()
                    stored += math.prod(shape) * _itemsize(dtype)
    return resident, stored


def _itemsize(safetensors_dtype: str) -> int:
    return {"F64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I64": 8, "F8_E4M3": 1, "I8": 1, "U8": 1}[
        safetensors_dtype
    ]
