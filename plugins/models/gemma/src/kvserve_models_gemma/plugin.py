"""Entry point of kvserve-models-gemma: Gemma 3 (text) and Gemma 2 under their HF ``architectures`` names."""

from kvserve import hookimpl
from kvserve.hookspecs import Register


@hookimpl
def register_models(register: Register) -> None:
    """Gemma 3 and Gemma 2 (one implementation, see :mod:`kvserve_models_gemma.model`)."""
    register("Gemma3ForCausalLM", "kvserve_models_gemma.model:Gemma3ForCausalLM")
    register("Gemma2ForCausalLM", "kvserve_models_gemma.model:Gemma2ForCausalLM")


@hookimpl
def register_gguf_architectures(register: Register) -> None:
    """The llama.cpp architectures of Gemma 3 and Gemma 2."""
    register("gemma3", "kvserve_models_gemma.gguf:Gemma3GGUF")
    register("gemma2", "kvserve_models_gemma.gguf:Gemma2GGUF")
