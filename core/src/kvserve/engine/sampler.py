"""Batched sampling: one pass over the batch's logits for greedy, temperature, top-k and top-p."""

from __future__ import annotations

import torch

from kvserve.sampling_params import SamplingParams


class Sampler:
    """Picks one token per row. Per-request seeds use a generator owned by that request, so a
    seeded request samples the same tokens whatever else is in the batch."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.request_generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self.request_generators.pop(request_id, None)

    def __call__(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]) -> list[int]:
        """``logits``: float32 ``[batch, vocab]`` → one token id per row."""
        greedy = torch.tensor([p.greedy for p in params])
        tokens = logits.argmax(dim=-1)
        if not greedy.all():
            random_rows = (~greedy).nonzero().squeeze(1)
            sub = [params[i] for i in random_rows.tolist()]
            probs = self._filtered_probs(logits[random_rows], sub)
            noise = self._exponential_noise(probs, [request_ids[i] for i in random_rows.tolist()], sub)
            tokens[random_rows] = (probs / noise).argmax(dim=-1)  # exponential race == multinomial draw
        return tokens.tolist()

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype).unsqueeze(1)
        logits = logits / temperature
        top_k = torch.tensor([p.top_k or logits.shape[1] for p in params]).clamp(max=logits.shape[1])
        top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype)
        if (top_k < logits.shape[1]).any() or (top_p < 1).any():
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            ranks = torch.arange(logits.shape[1]).unsqueeze(0)
            drop = ranks >= top_k.unsqueeze(1)
            sorted_probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
            # keep the smallest prefix whose mass reaches top_p (the top token is always kept)
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop |= mass_before >= top_p.unsqueeze(1)
            logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
        return logits.softmax(dim=-1)

    def _exponential_noise(
        self, probs: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for row, (request_id, p) in enumerate(zip(request_ids, params)):
            if p.seed is not None:
                gen = self.request_generators.get(request_id)
                if gen is None:
                    gen = self.request_generators[request_id] = torch.Generator().manual_seed(p.seed)
                noise[row].exponential_(generator=gen)
        return noise
