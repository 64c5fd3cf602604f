"""kvserve-models-llama passes the model contract for each architecture it registers.

The config variants cover what the shared implementation switches on: GQA / MHA / MQA,
tied embeddings, attention and MLP biases, Qwen3's decoupled head size and q/k norms.
"""

from kvserve.testing import GGUFArchitectureContract, ModelContract


class TestLlama(ModelContract):
    architecture = "LlamaForCausalLM"
    config_variants = {
        "gqa": {},
        "mha-tied-bias": {
            "num_key_value_heads": 4,
            "tie_word_embeddings": True,
            "attention_bias": True,
            "mlp_bias": True,
        },
    }


class TestMistral(ModelContract):
    architecture = "MistralForCausalLM"
    config_variants = {"mqa": {"num_key_value_heads": 1}}


class TestQwen2(ModelContract):
    architecture = "Qwen2ForCausalLM"
    config_variants = {"tied": {"tie_word_embeddings": True}}


class TestQwen3(ModelContract):
    architecture = "Qwen3ForCausalLM"
    config_variants = {"gqa": {}, "mha-bias": {"num_key_value_heads": 4, "attention_bias": True}}


class TestLlamaGGUF(GGUFArchitectureContract):
    gguf_architecture = "llama"


class TestQwen2GGUF(GGUFArchitectureContract):
    gguf_architecture = "qwen2"


class TestQwen3GGUF(GGUFArchitectureContract):
    gguf_architecture = "qwen3"
