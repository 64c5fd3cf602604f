"""The engine's adapters: loaded into a host LRU cache, run from a fixed number of slots."""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Iterable

from kvserve.lora.layers import SlotLoad
from kvserve.lora.peft_adapter import LoRAAdapter, load_peft_adapter
from kvserve.lora.request import LoRARequest
from kvserve.request import Request

logger = logging.getLogger("kvserve")

BASE_SLOT = -1
"""The slot of tokens that run the base model alone."""


class LoRAManager:
    """Decides, on the host, which adapter each of ``max_loras`` slots holds.

    Adapters are read once, checked against ``targets`` (the model's LoRA-capable modules by
    checkpoint name, each ``(input, output features)`` of the whole layer:
    :attr:`~kvserve.lora.layers.LoRASlots.targets`) and kept in a host cache of at most
    ``max_cached`` adapters that no request uses (least recently used leave first; those in use
    always stay). Before each step :meth:`activate` assigns the scheduled requests' adapters to
    slots and returns what the runners must load, so the scheduler must run at most ``max_loras``
    distinct adapters at once (``DistinctKeyLimit`` on :func:`adapter_id`).
    """

    def __init__(self, targets: dict[str, tuple[int, int]], max_loras: int, max_rank: int, max_cached: int) -> None:
        self.max_rank = max_rank
        self.max_cached = max_cached
        self.targets = targets
        """Module name -> (input, output features): what an adapter may target."""
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

    def activate(self, requests: Iterable[Request]) -> list[SlotLoad]:
        """Assign the adapters of ``requests`` (a step's) to slots: ones already there stay, the others
        take free slots or those of adapters this step does not run. Returns the adapters newly put
        into slots, which the step carries to every rank's runner to load before it runs."""
        wanted = {adapter_id(r) for r in requests}  # read once: ``requests`` may be a generator
        needed = wanted - {None, *self.slots}
        if not needed:
            return []
        spare = [slot for slot, held in enumerate(self.slots) if held is None or held not in wanted]
        if len(needed) > len(spare):
            raise RuntimeError(
                f"a step runs {len(wanted - {None})} distinct LoRA adapters but there are {len(self.slots)} slots "
                "(max_loras): the scheduler's admission rule was bypassed"
            )
        loads = []
        for slot, new_id in zip(spare, sorted(needed)):
            loads.append(SlotLoad(slot, self.cache[new_id].modules))
            self.slots[slot] = new_id
        return loads

    def slot_of(self, request: Request) -> int:
        """The slot of ``request``'s adapter in this step (:data:`BASE_SLOT` without one): the per-token
        metadata the LoRA layers read."""
        key = adapter_id(request)
        return BASE_SLOT if key is None else self.slots.index(key)


def adapter_id(request: Request) -> int | None:
    """The ``lora_int_id`` ``request`` runs with; None for the base model."""
    return None if request.lora_request is None else request.lora_request.lora_int_id
