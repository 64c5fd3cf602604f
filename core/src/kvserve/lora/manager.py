"""The engine's adapters: loaded into a host LRU cache, run from a fixed number of slots."""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Iterable

import torch

from kvserve.interfaces.lora_kernel import LoRAKernel
from kvserve.layers.linear import LinearBase
from kvserve.lora.layers import LoRALinear, LoRAStep
from kvserve.lora.peft_adapter import LoRAAdapter, load_peft_adapter
from kvserve.lora.request import LoRARequest
from kvserve.request import Request

logger = logging.getLogger("kvserve")

BASE_SLOT = -1
"""The slot of tokens that run the base model alone."""


class LoRAManager:
    """Gives every linear layer of ``model`` ``max_loras`` adapter slots and keeps them filled.

    Adapters are read once and kept in a host cache of at most ``max_cached`` adapters that no
    request uses (least recently used leave first; those in use always stay). Before each step
    :meth:`activate` puts the adapters of the scheduled requests into slots, so the scheduler must
    run at most ``max_loras`` distinct adapters at once (``DistinctKeyLimit`` on :func:`adapter_id`).
    """

    def __init__(
        self, model: torch.nn.Module, kernel: LoRAKernel, max_loras: int, max_rank: int, max_cached: int
    ) -> None:
        device = next(model.parameters()).device
        self.step = LoRAStep(kernel, device)
        self.max_rank = max_rank
        self.max_cached = max_cached
        self.linears: list[tuple[LoRALinear, list[str]]] = []
        """Each LoRA layer and the checkpoint names of its slices."""
        self.targets: dict[str, tuple[int, int]] = {}
        """Module name -> (input, output features): what an adapter may target."""
        for module in model.modules():
            if isinstance(module, LinearBase):
                lora = LoRALinear(
                    module.input_size, module.output_sizes, max_loras, max_rank, self.step, module.params_dtype
                )
                module.lora = lora
                self.linears.append((lora, module.shard_prefixes))
                for name, size in zip(module.shard_prefixes, module.output_sizes):
                    self.targets[name] = (module.input_size, size)
        self.cache: OrderedDict[int, LoRAAdapter] = OrderedDict()
        """Loaded adapters by ``lora_int_id``, least recently used first."""
        self.users: dict[str, int] = {}
        """Request id -> the adapter it runs with."""
        self.in_use: Counter[int] = Counter()
        self.removed: set[int] = set()
        """Adapters :meth:`remove` dropped while requests still ran them: freed after the last one."""
        self.slots: list[int | None] = [None] * max_loras
        """Slot -> the adapter it holds."""

    def load(self, lora_request: LoRARequest) -> LoRAAdapter:
        """The adapter, read now unless cached. ValueError naming the problem: an id or name already
        taken by another adapter, or what :func:`load_peft_adapter` refuses."""
        for cached in self.cache.values():
            if cached.request.lora_int_id in self.removed:  # leaving: its name may be loaded again
                continue
            same_id = cached.request.lora_int_id == lora_request.lora_int_id
            same_name = cached.request.lora_name == lora_request.lora_name
            if (same_id or same_name) and (cached.request.lora_name, cached.request.lora_path) != (
                lora_request.lora_name, lora_request.lora_path,
            ):  # fmt: skip
                taken = cached.request
                raise ValueError(
                    f"lora_request: {'lora_int_id ' + str(taken.lora_int_id) if same_id else 'lora_name'} is "
                    f"already adapter {taken.lora_name!r} (id {taken.lora_int_id}, {taken.lora_path}); "
                    "an id and a name each name one adapter"
                )
        adapter = self.cache.get(lora_request.lora_int_id)
        if adapter is None:
            adapter = load_peft_adapter(lora_request, self.max_rank, self.targets)
            self.cache[lora_request.lora_int_id] = adapter
            logger.info(
                "LoRA adapter %r (id %d, rank %d, %d modules) loaded from %s", lora_request.lora_name,
                lora_request.lora_int_id, adapter.rank, len(adapter.modules), lora_request.lora_path,
            )  # fmt: skip
        self.cache.move_to_end(lora_request.lora_int_id)
        self._evict()
        return adapter

    def acquire(self, request_id: str, lora_request: LoRARequest) -> None:
        """``request_id`` runs with ``lora_request`` (loaded now if needed; ValueError as :meth:`load`)."""
        self.load(lora_request)
        self.users[request_id] = lora_request.lora_int_id
        self.in_use[lora_request.lora_int_id] += 1

    def release(self, request_id: str) -> None:
        """``request_id`` has finished (unknown or already released ids are ignored)."""
        adapter_id = self.users.pop(request_id, None)
        if adapter_id is not None:
            self.in_use[adapter_id] -= 1
            if not self.in_use[adapter_id]:
                del self.in_use[adapter_id]
                if adapter_id in self.removed:
                    self.remove(adapter_id)
            self._evict()

    def remove(self, adapter_id: int) -> None:
        """Drop adapter ``adapter_id`` from the cache and its slot, now if no request runs it, else once
        the last one has released it (those finish with it). Unknown ids are ignored."""
        if adapter_id in self.in_use:
            self.removed.add(adapter_id)
            return
        self.removed.discard(adapter_id)
        self.cache.pop(adapter_id, None)
        if adapter_id in self.slots:
            self.slots[self.slots.index(adapter_id)] = None

    def _evict(self) -> None:
        """Drop least recently used adapters no request uses while the cache holds too many (never the
        one loaded last: it is about to be used)."""
        idle = [adapter_id for adapter_id in list(self.cache)[:-1] if adapter_id not in self.in_use]
        for adapter_id in idle[: max(len(self.cache) - self.max_cached, 0)]:
            del self.cache[adapter_id]
            if adapter_id in self.slots:  # its id may name another adapter once it is loaded again
                self.slots[self.slots.index(adapter_id)] = None

    def activate(self, requests: Iterable[Request]) -> None:
        """Put the adapters of ``requests`` (a step's) into slots: ones already there stay, the others
        take free slots or those of adapters this step does not run."""
        wanted = {adapter_id(r) for r in requests}  # read once: ``requests`` may be a generator
        needed = wanted - {None, *self.slots}
        if not needed:
            return
        spare = [slot for slot, held in enumerate(self.slots) if held is None or held not in wanted]
        if len(needed) > len(spare):
            raise RuntimeError(
                f"a step runs {len(wanted - {None})} distinct LoRA adapters but there are {len(self.slots)} slots "
                "(max_loras): the scheduler's admission rule was bypassed"
            )
        for slot, new_id in zip(spare, sorted(needed)):
            adapter = self.cache[new_id]
            for lora, names in self.linears:
                lora.set_slot(slot, [adapter.modules.get(name) for name in names])
            self.slots[slot] = new_id

    def slot_of(self, request: Request) -> int:
        """The slot of ``request``'s adapter in this step (:data:`BASE_SLOT` without one): the per-token
        metadata the LoRA layers read."""
        key = adapter_id(request)
        return BASE_SLOT if key is None else self.slots.index(key)


def adapter_id(request: Request) -> int | None:
    """The ``lora_int_id`` ``request`` runs with; None for the base model."""
    return None if request.lora_request is None else request.lora_request.lora_int_id
