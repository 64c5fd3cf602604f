"""Sampling: the sampler pipeline's stages, the draw, and logprobs."""

from kvserve.sampling.draw import row_argmax, row_topk
from kvserve.sampling.logprobs import LogprobsMode, token_logprobs
from kvserve.sampling.pipeline import Sampler, SamplerOutput, default_stages
from kvserve.sampling.stage import SamplerStage
from kvserve.sampling.token_filters import bad_word_token_ids

__all__ = [
    "LogprobsMode",
    "Sampler",
    "SamplerOutput",
    "SamplerStage",
    "bad_word_token_ids",
    "default_stages",
    "row_argmax",
    "row_topk",
    "token_logprobs",
]
