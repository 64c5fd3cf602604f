"""The peers' models: random-weight Llamas (seed 0, float32) with a byte-level BPE tokenizer trained on this
Python's standard library sources, so every engine loads the same files without a download.

- ``tiny-llama``: hidden 256, 4 layers, 8 heads (4 KV heads), ~12M parameters;
- ``llama-100m``: hidden 768, 12 layers, 12 heads (4 KV heads), ~125M parameters, vocabulary 32000.

    python benchmarks/peers/make_models.py ~/.cache/kvserve-peers/models
"""

import glob
import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 32000
SPECIAL = ["<s>", "</s>", "<unk>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SHAPES = {
    "tiny-llama": dict(
        hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4
    ),
    "llama-100m": dict(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4
    ),
}


def corpus_files() -> list[str]:
    """The standard library's sources and the system's licence texts, in a fixed order."""
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "**/*.py"), recursive=True))
    files += sorted(glob.glob("/usr/share/common-licenses/*"))
    return [f for f in files if os.path.isfile(f)]


def train_tokenizer(files: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip

    def texts():
        for f in files:
            with open(f, encoding="utf-8", errors="ignore") as fh:
                yield fh.read()

    tok.train_from_iterator(texts(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    print("trained vocab:", tok.get_vocab_size())
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def make(root: str, name: str, hf_tok: PreTrainedTokenizerFast, **shape) -> None:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB, max_position_embeddings=2048, rms_norm_eps=1e-5, bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id, pad_token_id=hf_tok.pad_token_id, tie_word_embeddings=False,
        rope_theta=10000.0, torch_dtype="float32", **shape,
    )  # fmt: skip
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    out = os.path.join(root, name)
    model.save_pretrained(out, safe_serialization=True)
    hf_tok.save_pretrained(out)
    GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    ).save_pretrained(out)
    print(name, f"params={sum(p.numel() for p in model.parameters()) / 1e6:.1f}M ->", out)


def make_compatible(directory: str) -> None:
    """Write the configs so that older transformers (4.x, in the peers' venvs) and llama.cpp's converter read
    the same files."""
    config_path = os.path.join(directory, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config.setdefault("rope_theta", 10000.0)
    config["torch_dtype"] = "float32"
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
    tokenizer_path = os.path.join(directory, "tokenizer_config.json")
    with open(tokenizer_path) as f:
        tokenizer = json.load(f)
    tokenizer.update(
        tokenizer_class="PreTrainedTokenizerFast", model_max_length=2048, add_bos_token=True,
        chat_template=CHAT_TEMPLATE,
    )  # fmt: skip
    with open(tokenizer_path, "w") as f:
        json.dump(tokenizer, f, indent=2)


def main(root: str) -> None:
    files = corpus_files()
    print("corpus files:", len(files))
    hf_tok = train_tokenizer(files)
    for name, shape in SHAPES.items():
        make(root, name, hf_tok, **shape)
        make_compatible(os.path.join(root, name))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
