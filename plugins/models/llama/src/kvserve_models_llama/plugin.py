"""Entry point of kvserve-models-llama: the Llama family under its HF ``architectures`` names."""

from kvserve import hookimpl
from kvserve.hookspecs import Register


@hookimpl
def register_models(register: Register) -> None:
    """Llama, Mistral, Qwen2 and Qwen3 (one implementation, see :mod:`kvserve_models_llama.model`)."""
    register("LlamaForCausalLM", "kvserve_models_llama.model:LlamaForCausalLM")
    register("MistralForCausalLM", "kvserve_models_llama.model:MistralForCausalLM")
    register("Qwen2ForCausalLM", "kvserve_models_llama.model:Qwen2ForCausalLM")
    register("Qwen3ForCausalLM", "kvserve_models_llama.model:Qwen3ForCausalLM")


@hookimpl
def register_gguf_architectures(register: Register) -> None:
    """The llama.cpp architectures of those models (Mistral's GGUF files say ``"llama"``)."""
    register("llama", "kvserve_models_llama.gguf:LlamaGGUF")
    register("qwen2", "kvserve_models_llama.gguf:Qwen2GGUF")
    register("qwen3", "kvserve_models_llama.gguf:Qwen3GGUF")
