"""Entry point: ``[project.entry-points.kvserve] example_model = "kvserve_example_model.plugin"``."""

from kvserve import hookimpl


@hookimpl
def register_models(register):
    # The name is the `architectures` entry of the checkpoint's config.json.
    register("GPT2LMHeadModel", "kvserve_example_model.gpt2:GPT2LMHeadModel")
