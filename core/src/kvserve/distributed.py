"""This process's place in a tensor-parallel group, and the collectives the parallel layers use.

A process that never called :func:`init` is rank 0 of a group of one: every collective is a
no-op, so the single-device path runs exactly as without tensor parallelism. Workers of a
multiprocess or Ray executor call :func:`init` before they build the model; the parallel linear
layers read :func:`rank` and :func:`world_size` when they are built, and the platform reads
:func:`local_rank` to pick the rank's device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class _Group:
    rank: int
    world_size: int
    local_rank: int


_group = _Group(0, 1, 0)


def init(rank: int, world_size: int, backend: str, init_method: str, local_rank: int | None = None) -> None:
    """Join the default torch.distributed group as ``rank`` of ``world_size`` over ``backend``
    (the platform's ``distributed_backend``: gloo, nccl) at ``init_method`` (``tcp://host:port``).

    ``local_rank`` is the index of this rank's device among the devices this process sees: the
    rank itself (the default) for workers sharing one machine's devices, 0 for a Ray actor that
    sees only the device of its bundle."""
    global _group
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    _group = _Group(rank, world_size, rank if local_rank is None else local_rank)


def destroy() -> None:
    """Leave the group (back to a group of one)."""
    global _group
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _group = _Group(0, 1, 0)


def rank() -> int:
    """This process's tensor-parallel rank (0 outside a group)."""
    return _group.rank


def local_rank() -> int:
    """The index of this rank's device among the devices this process sees (0 outside a group);
    a platform with several devices drives this one in a worker (CUDA: ``cuda:<local_rank>``)."""
    return _group.local_rank


def world_size() -> int:
    """The number of tensor-parallel ranks (1 outside a group)."""
    return _group.world_size


def is_worker() -> bool:
    """Whether this process is a rank of a tensor-parallel group (it runs a model shard)."""
    return _group.world_size > 1


def all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``tensor`` over every rank (in place; ``tensor`` itself for one rank)."""
    if _group.world_size == 1:
        return tensor
    import torch.distributed as dist

    dist.all_reduce(tensor)
    return tensor


def all_gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along ``dim`` in rank order (``tensor`` for one rank)."""
    if _group.world_size == 1:
        return tensor
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(_group.world_size)]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=dim)


def gather(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor | None:
    """Every rank's ``tensor`` (the same shape on each) concatenated along ``dim`` in rank order, on
    rank 0; ``None`` on the other ranks (``tensor`` itself for one rank)."""
    if _group.world_size == 1:
        return tensor
    import torch.distributed as dist

    tensor = tensor.contiguous()
    if _group.rank != 0:
        dist.gather(tensor, dst=0)
        return None
    parts = [torch.empty_like(tensor) for _ in range(_group.world_size)]
    dist.gather(tensor, parts, dst=0)
    return torch.cat(parts, dim=dim)
