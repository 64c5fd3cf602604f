"""Where a sampled row's random numbers come from.

A seeded request draws from generators of its own and nothing else does, so its tokens depend on its
own seed, logits and parameters only — never on its neighbours in the batch, their number or their
filters. Its draw for output position ``p`` comes from a generator seeded by its seed and ``p``, made
fresh for each sampling call (continued by that call's further rounds, see
:mod:`kvserve.sampling.draw`): so the token at ``p`` does not depend on how the steps were cut
either — with speculative decoding, whether ``p`` was sampled to verify a draft or after one was
rejected. Unseeded rows share one generator per device, seeded from the engine seed.
"""

from __future__ import annotations

import torch

from kvserve.request import Request

MASK64 = (1 << 64) - 1


def position_seed(seed: int, position: int) -> int:
    """A 63-bit generator seed for output position ``position`` of a request seeded ``seed``
    (splitmix64's finalizer over both, so neighbouring seeds and positions share no stream)."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return (x ^ (x >> 31)) >> 1


class NoiseSource:
    """The engine's generators: one shared per device, and per sampling call one for each seeded
    request's output position sampled in it."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._shared: dict[torch.device, torch.Generator] = {}
        self._per_position: dict[tuple[str, int], torch.Generator] = {}

    def start_call(self) -> None:
        """A sampling call begins: seeded positions draw from fresh generators again."""
        self._per_position.clear()

    def uniform(self, requests: list[Request], device: torch.device) -> torch.Tensor:
        """One U[0, 1) float32 draw per request, on ``device``: seeded requests from their own
        generator, the others together from the shared one (one call for all of them)."""
        draws = torch.empty(len(requests), dtype=torch.float32, device=device)
        unseeded = [row for row, r in enumerate(requests) if r.sampling_params.seed is None]
        if len(unseeded) == len(requests):
            return draws.uniform_(generator=self._shared_generator(device))
        if unseeded:
            shared = torch.empty(len(unseeded), device=device).uniform_(generator=self._shared_generator(device))
            draws[torch.tensor(unseeded, device=device)] = shared
        for row, request in enumerate(requests):
            if request.sampling_params.seed is not None:
                draws[row : row + 1].uniform_(generator=self._request_generator(request, device))
        return draws

    def _shared_generator(self, device: torch.device) -> torch.Generator:
        gen = self._shared.get(device)
        if gen is None:
            gen = self._shared[device] = torch.Generator(device=device).manual_seed(self.seed)
        return gen

    def _request_generator(self, request: Request, device: torch.device) -> torch.Generator:
        """The generator of the request's next output position, in this call."""
        position = len(request.output_token_ids)
        key = (request.request_id, position)
        gen = self._per_position.get(key)
        if gen is None:
            gen = torch.Generator(device=device).manual_seed(position_seed(request.sampling_params.seed, position))
            self._per_position[key] = gen
        return gen
