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
