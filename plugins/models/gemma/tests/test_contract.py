"""kvserve-models-gemma passes the model contract for each architecture it registers.

The variants cover what the shared implementation switches on: GQA / MQA, tied and untied
embeddings, local layers whose window (5) is shorter than the sequences (up to 17 tokens) beside
global ones, Gemma 3's rope base per layer type (with linear scaling on the global layers, as
the larger Gemma 3 models have), Gemma 2's soft-capping of attention scores and final logits
(caps small enough to bite on these random weights).
"""

from kvserve.testing import GGUFArchitectureContract, ModelContract

# Tiny models keep Gemma's mix: local layers, then a global one (layer_types from the pattern).
GEMMA3_TINY = {
    "num_hidden_layers": 3,
    "head_dim": 32,
    "sliding_window_pattern": 3,
    "sliding_window": 5,
    "query_pre_attn_scalar": 24,
}


class TestGemma3(ModelContract):
    architecture = "Gemma3ForCausalLM"
    config_variants = {
        "gqa-tied": GEMMA3_TINY,
        "mqa-untied-rope-scaled": {
            **GEMMA3_TINY,
            "num_key_value_heads": 1,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
        },
    }


class TestGemma2(ModelContract):
    architecture = "Gemma2ForCausalLM"
    config_variants = {
        "gqa-tied-capped": {
            "num_hidden_layers": 3,
            "head_dim": 32,
            "sliding_window": 5,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": 3.0,
        },
        "default-caps": {"num_hidden_layers": 3, "head_dim": 32, "sliding_window": 5},
    }


class TestGemma3GGUF(GGUFArchitectureContract):
    gguf_architecture = "gemma3"
    hf_model_type = "gemma3_text"


class TestGemma2GGUF(GGUFArchitectureContract):
    gguf_architecture = "gemma2"
