"""Where a sampled row's random numbers come from.

A seeded request draws from its own generator and nothing else does, so its tokens depend on its
own seed, logits and parameters only — never on its neighbours in the batch, their number or their
filters. Unseeded rows share one generator per device, seeded from the engine seed.
"""

from __future__ import annotations

import torch

from kvserve.request import Request


class NoiseSource:
    """The engine's generators: one shared per device, one per seeded request while it lives."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._shared: dict[torch.device, torch.Generator] = {}
        self._per_request: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        """Drop ``request_id``'s generator once it has finished."""
        self._per_request.pop(request_id, None)

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
        gen = self._per_request.get(request.request_id)
        if gen is None:
            gen = torch.Generator(device=device).manual_seed(request.sampling_params.seed)
            self._per_request[request.request_id] = gen
        return gen
