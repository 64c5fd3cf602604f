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


def build_tiny_model(arch: str, path: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a random ``arch`` model (``"llama"``, ``"mistral"``, ``"qwen2"``, ``"qwen3"``) to ``path``.

    ``overrides`` change config fields, e.g. ``num_key_value_heads=4`` (MHA) or
    ``tie_word_embeddings=True``.
    """
    import torch
    import transformers

    config_cls = {
        "llama": transformers.LlamaConfig,
        "mistral": transformers.MistralConfig,
        "qwen2": transformers.Qwen2Config,
        "qwen3": transformers.Qwen3Config,
    }[arch]
    fields = dict(_BASE, **overrides)
    if arch == "mistral":
        fields.setdefault("sliding_window", None)
    if arch == "qwen3":
        fields.setdefault("head_dim", 32)
    config = config_cls(**fields)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # HF's init is tiny; widen it so logits are not near-ties everywhere
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0.0, 0.15)
    model.save_pretrained(path, safe_serialization=True)
    build_tokenizer(path, config.vocab_size)
    return path
