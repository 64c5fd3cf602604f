"""The sampler: named, batched stages over the logits, then one draw per row, then logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvserve.errors import UnsatisfiableRequestError
from kvserve.interfaces.sampling_kernel import SamplingKernel
from kvserve.outputs import TokenLogprobs
from kvserve.request import Request
from kvserve.sampling.batch import SamplingBatch
from kvserve.sampling.constraint_mask import ConstraintMaskStage
from kvserve.sampling.draw import draw, row_argmax
from kvserve.sampling.logprobs import LogprobsMode, token_logprobs, truncated_logits
from kvserve.sampling.noise import NoiseSource
from kvserve.sampling.penalties import PenaltiesStage
from kvserve.sampling.request_processors import RequestLogitsProcessorsStage
from kvserve.sampling.stage import SamplerStage
from kvserve.sampling.token_filters import AllowedAndBadTokensStage, LogitBiasStage
from kvserve.sampling.torch_kernel import TorchSamplingKernel


@dataclass
class SamplerOutput:
    tokens: list[int]
    """Per row; meaningless for the rows in ``errors``."""
    logprobs: list[TokenLogprobs] | None
    """Per row, when any row asked for logprobs: its top-N plus the chosen token."""
    errors: dict[int, str] = field(default_factory=dict)
    """Row -> what failed while processing that row's logits (its request must be failed)."""
    invalid_rows: set[int] = field(default_factory=set)
    """Rows among ``errors`` whose own parameters caused the failure (a client error)."""


RULED_OUT = (
    "every token is ruled out (by its structured_outputs grammar, allowed_token_ids and bad_words, "
    "with min_tokens banning EOS and stop tokens)"
)


def default_stages(extra: list[SamplerStage] = ()) -> list[SamplerStage]:
    """vLLM's order: the constraint (grammar) mask, the requests' own logits processors, ``extra`` (the
    engine's batch-level logits processors), allowed/bad tokens, logit bias, penalties."""
    return [
        ConstraintMaskStage(),
        RequestLogitsProcessorsStage(),
        *extra,
        AllowedAndBadTokensStage(),
        LogitBiasStage(),
        PenaltiesStage(),
    ]


class Sampler:
    """Picks one token per row; then temperature, min-p, top-k, top-p and the draw (see
    :mod:`kvserve.sampling.draw`), or the argmax for greedy rows.

    A seeded request draws from generators of its own seed and output position, so its tokens do not
    depend on what else is in the batch (nor on how steps verify drafts). Stages that change no row
    this step cost one cheap check; the caller's logits are never written.
    """

    def __init__(
        self,
        seed: int,
        stages: list[SamplerStage] | None = None,
        logprobs_mode: LogprobsMode = "raw_logprobs",
        kernel: SamplingKernel | None = None,
    ) -> None:
        """``kernel``: the platform's draw for rows without a top-k (core's PyTorch one by default)."""
        self.noise = NoiseSource(seed)
        self.stages = default_stages() if stages is None else stages
        self.logprobs_mode = logprobs_mode
        self.kernel = kernel or TorchSamplingKernel()

    @torch.inference_mode()  # the runner's logits are inference tensors: written in place only in this mode
    def __call__(self, logits: torch.Tensor, requests: list[Request], logits_owned: bool = False) -> SamplerOutput:
        """``logits``: float32 ``[rows, vocab]``, row ``i`` belonging to ``requests[i]``, left as given
        unless ``logits_owned`` (the caller never reads them again: the stages may write over them)."""
        self.noise.start_call()
        raw = logits
        reads_raw = self.logprobs_mode.startswith("raw") and any(
            r.sampling_params.logprobs is not None for r in requests
        )
        logits, batch = self.process(logits, requests, in_place=logits_owned and not reads_raw)
        sampled = batch.sampled_rows
        if not sampled:
            tokens = row_argmax(logits)
        elif len(sampled) == len(requests):
            tokens = draw(logits, requests, self.noise, self.kernel)
        else:
            tokens = row_argmax(logits)
            index = torch.tensor(sampled, device=logits.device)
            tokens[index] = draw(logits[index], [requests[i] for i in sampled], self.noise, self.kernel)
        logprobs = None
        if batch.wants_logprobs:
            top_ns = [r.sampling_params.logprobs or 0 for r in requests]
            logprobs = token_logprobs(self._reported(raw, logits, batch), tokens, top_ns)
        return SamplerOutput(tokens.tolist(), logprobs, batch.errors, batch.invalid_rows)

    def process(
        self, logits: torch.Tensor, requests: list[Request], in_place: bool = False
    ) -> tuple[torch.Tensor, SamplingBatch]:
        """Run the stages that change some row this step over a copy of ``logits`` (over ``logits``
        itself when ``in_place``: nothing reads the raw values after); returns the processed logits and
        the batch (its ``errors``: rows whose processing failed)."""
        batch = SamplingBatch(requests, logits.device)
        active = [stage for stage in self.stages if stage.wants(batch)]
        if not active:
            return logits, batch
        if not in_place:  # a copy of the whole batch's logits costs up to a millisecond a step on CPU
            logits = logits.clone()
        for stage in active:
            logits = stage.apply(logits, batch)
        # Masks that together rule out every token (a grammar at a dead end, allowed_token_ids holding
        # only EOS before min_tokens): that request fails; its row is drawn from harmless zeros.
        for row in (logits.amax(dim=1) == float("-inf")).nonzero().flatten().tolist():
            batch.fail(row, "choosing a token", UnsatisfiableRequestError(RULED_OUT))
            logits[row] = 0.0
        return logits, batch

    def _reported(self, raw: torch.Tensor, processed: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The distribution logprobs report, per ``logprobs_mode``."""
        if self.logprobs_mode.startswith("raw"):
            values = raw
        else:
            values = processed.clone()
            sampled = batch.sampled_rows
            if sampled:
                index = torch.tensor(sampled, device=values.device)
                rows = [batch.requests[i] for i in sampled]
                temperature = torch.tensor([r.sampling_params.temperature for r in rows], device=values.device)
                values[index] = truncated_logits(values[index] / temperature.unsqueeze(1), rows)
        return values.log_softmax(dim=-1) if self.logprobs_mode.endswith("logprobs") else values

    def accept(self, request: Request, token_ids: list[int]) -> None:
        """``request`` emitted ``token_ids`` this step: every stage's per-request state advances. Raises
        when a stage refuses them (the caller fails that request)."""
        for stage in self.stages:
            stage.on_accept(request, token_ids)

    def forget(self, request_id: str) -> None:
        """Drop what is kept for ``request_id`` (its stages' state) once it has finished."""
        for stage in self.stages:
            stage.forget(request_id)
