"""Entry point: ``[project.entry-points.kvserve] example_model = "kvserve_example_model.plugin"``."""

from kvserve import hookimpl


@hookimpl
def register_models(register):
    # The name is the `architectures` entry of the checkpoint's config.json.
    register("GPT2LMHeadModel", "kvserve_example_model.gpt2:GPT2LMHeadModel")


@hookimpl
def register_gguf_architectures(register):
    # The name is the GGUF file's general.architecture; the loader asks for it when opening a .gguf.
    register("gpt2", "kvserve_example_model.gguf:GPT2GGUF")
