"""Tiny random-weight HF checkpoints built locally (config.json, safetensors, tokenizer files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY_VOCAB = 384
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "Paged attention stores keys and values in fixed size blocks.",
    "Continuous batching admits new requests while others are still decoding.",
    "0123456789 +-*/=()[]{}<>.,;:!? abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
]

# Small enough to run in a second on CPU, large enough to have GQA, several layers and rope.
_BASE = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def build_tokenizer(path: Path, vocab_size: int = TINY_VOCAB) -> Any:
    """A byte-level BPE tokenizer trained on a few sentences, saved as HF tokenizer files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(path)
    return fast


# Config fields some model types need for a tiny model (by ``model_type``).
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": None},
    "qwen3": {"head_dim": 32},  # decoupled from hidden_size / heads, as in the real Qwen3
}


def build_tiny_model(
    arch: str,
    path: Path,
    seed: int = 0,
    *,
    randomize_vectors: bool = False,
    registered_as: str | None = None,
    **overrides: Any,
) -> Path:
    """Save a small random HF checkpoint (config.json, safetensors, tokenizer files) to ``path``.

    ``arch`` is a transformers model type (``"llama"``, ``"mistral"``, ``"qwen2"``, ``"qwen3"``,
    ...) or a transformers model class name (``"LlamaForCausalLM"``, ``"GPT2LMHeadModel"``).
    ``overrides`` change config fields, e.g. ``num_key_value_heads=4`` (MHA) or
    ``tie_word_embeddings=True``. ``randomize_vectors`` also draws biases and norm weights at
    random, so a loader that dropped them would be noticed. ``registered_as`` rewrites the
    config's ``architectures`` (for a plugin registered under its own name).
    """
    import torch
    import transformers

    model_cls = None
    if arch in transformers.CONFIG_MAPPING:
        config_cls = transformers.CONFIG_MAPPING[arch]
    else:
        model_cls = getattr(transformers, arch, None)
        config_cls = getattr(model_cls, "config_class", None)
        if config_cls is None:
            raise ValueError(
                f"unknown architecture {arch!r}: give a transformers model type (a key of "
                "transformers.CONFIG_MAPPING) or model class name (an attribute of transformers)"
            )
    known = set(config_cls().to_dict()) | set(config_cls.attribute_map)
    fields = {k: v for k, v in _BASE.items() if k in known}  # e.g. GPT-2 has no KV head count
    fields.update(_TYPE_DEFAULTS.get(config_cls.model_type, {}))
    fields.update(overrides)
    config = config_cls(**fields)
    torch.manual_seed(seed)
    if model_cls is None:
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        model = model_cls(config).float()
    with torch.no_grad():  # HF's init is tiny; widen it so logits are not near-ties everywhere
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.15)
            elif randomize_vectors:
                base = 1.0 if bool((param == 1).all()) else 0.0  # norm gains start at 1, biases at 0
                param.copy_(base + 0.3 * torch.randn(param.shape))
    if registered_as is not None:
        model.config.architectures = [registered_as]
    model.save_pretrained(path, safe_serialization=True)
    build_tokenizer(path, config.vocab_size)
    return path


def layer_skip_draft(target: Path, dest: Path, num_layers: int) -> Path:
    """Write the checkpoint of ``target``'s first ``num_layers`` decoder layers to ``dest`` (embeddings,
    final norm and head kept, its config saying so, its tokenizer copied): a draft model for speculative
    decoding that shares the target's vocabulary, where no smaller model of the family is at hand."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True)
    for path in target.iterdir():
        if path.suffix == ".safetensors":
            tensors = {
                name: tensor
                for name, tensor in load_file(path).items()
                if not name.startswith("model.layers.") or int(name.split(".")[2]) < num_layers
            }
            save_file(tensors, dest / path.name, metadata={"format": "pt"})
        elif path.name == "config.json":
            config = json.loads(path.read_text())
            config["num_hidden_layers"] = num_layers
            if "layer_types" in config:
                config["layer_types"] = config["layer_types"][:num_layers]
            (dest / path.name).write_text(json.dumps(config))
        elif path.is_file():
            shutil.copy(path, dest / path.name)
    return dest


COMPLETE_MARKER = ".kvserve-complete"
"""Written last inside a converted directory: a directory without it is never used."""


def embedded_hf_directory() -> Path:
    """The embedded default model as an HF-format directory (config.json, float32 model.safetensors,
    tokenizer files) in kvserve's cache (``$KVSERVE_CACHE_DIR`` or the platform's user cache),
    converted from its GGUF on first use: for what reads only HF checkpoints (the peers the
    benchmarks run, HF baselines, :func:`layer_skip_draft`). kvserve itself opens the GGUF."""
    import importlib.metadata
    import os

    import platformdirs

    from kvserve.loader.default_model import WHEEL_DISTRIBUTION, embedded_gguf_path

    gguf_path = embedded_gguf_path()
    version = importlib.metadata.version(WHEEL_DISTRIBUTION)
    cache = Path(os.environ.get("KVSERVE_CACHE_DIR") or platformdirs.user_cache_dir("kvserve"))
    target = cache / "models" / f"{gguf_path.stem}-{version}"
    if not (target / COMPLETE_MARKER).is_file():
        convert_gguf_to_hf_directory(gguf_path, target)
    return target


def convert_gguf_to_hf_directory(gguf_path: Path, target: Path) -> None:
    """Write ``gguf_path`` as config.json + float32 model.safetensors + tokenizer files at ``target``.

    The directory is built under a temporary name next to ``target`` and renamed into place,
    so a crash or a concurrent conversion never leaves a half-written ``target`` in use.
    """
    import shutil
    import sys
    import tempfile

    from safetensors.torch import save_file
    from tqdm import tqdm

    from kvserve.loader.gguf_source import open_gguf

    print(f"Converting {gguf_path.name} once to {target} ...", file=sys.stderr)
    source = open_gguf(gguf_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        progress = tqdm(source.weights(), total=source.num_tensors, unit="tensor", file=sys.stderr)
        save_file(dict(progress), staging / "model.safetensors", metadata={"format": "pt"})
        source.hf_config.dtype = "float32"  # what model.safetensors holds
        del source.hf_config.quantization_config  # the directory holds dequantized weights
        source.hf_config.save_pretrained(staging)
        source.tokenizer.save_pretrained(staging)
        (staging / COMPLETE_MARKER).write_text(f"converted from {gguf_path}\n")
        if target.exists() and not (target / COMPLETE_MARKER).is_file():
            shutil.rmtree(target)  # an incomplete leftover, not something a conversion renamed here
        try:
            staging.rename(target)
        except OSError:
            if not (target / COMPLETE_MARKER).is_file():
                raise
            # Another process finished the same conversion first; its result is equivalent.
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def served_model_type() -> str:
    """A transformers model type whose causal-LM architecture an installed model plugin serves (the first
    in registration order), for contracts that need some model to run the engine on; PluginError when
    none is installed."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from kvserve.errors import PluginError
    from kvserve.plugins import get_plugin_manager

    model_types = {architecture: model_type for model_type, architecture in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()}
    for name in get_plugin_manager().registry("model").names():
        if name in model_types:
            return model_types[name]
    raise PluginError("no installed model plugin serves a transformers causal-LM architecture to build a tiny model of")


def build_lora_adapter(base: Path, path: Path, seed: int = 0, scale: float = 0.2, **lora_config: Any) -> Path:
    """Save a PEFT LoRA adapter of the checkpoint in ``base`` to ``path``, made with the real ``peft``
    library (``get_peft_model`` with ``LoraConfig(**lora_config)``, e.g. ``r=8, lora_alpha=16,
    target_modules=["q_proj", "v_proj"], use_rslora=True``), its A and B drawn at random (normal,
    std ``scale``): PEFT starts B at zero, an adapter that would change nothing."""
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    adapted = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, **lora_config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
    adapted.save_pretrained(path)
    return path


def hf_greedy(
    base: Path, prompt_ids: list[list[int]], max_new_tokens: int, adapter: Path | None = None
) -> list[tuple[list[int], list[float]]]:
    """HF ``generate`` (greedy, float32, exactly ``max_new_tokens``) of the checkpoint in ``base``, or of
    ``peft``'s ``PeftModel`` with the adapter in ``adapter``: per prompt, the tokens and their logprobs."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        import peft

        model = peft.PeftModel.from_pretrained(model, adapter)
    model.eval()
    results = []
    for ids in prompt_ids:
        with torch.no_grad():
            out = model.generate(
                input_ids=torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens, output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
        tokens = out.sequences[0, len(ids) :].tolist()
        logprobs = [float(step[0].log_softmax(-1)[token]) for step, token in zip(out.logits, tokens)]
        results.append((tokens, logprobs))
    return results
