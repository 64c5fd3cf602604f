"""The example GPT-2 passes the model contract against transformers' GPT2LMHeadModel."""

from kvserve.testing import ModelContract


class TestGPT2(ModelContract):
    architecture = "GPT2LMHeadModel"
