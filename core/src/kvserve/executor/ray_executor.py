"""The Ray executor: one Ray actor per tensor-parallel rank, placed by a placement group, so that
ranks may span the machines of a Ray cluster.

It joins the Ray instance this process is connected to, else the cluster at ``RAY_ADDRESS``,
else starts a local one (and shuts it down again with the engine). The placement group holds one
bundle per rank, ``{"CPU": 1}`` plus one of the platform's :attr:`~kvserve.interfaces.Platform.ray_resource`
(``"GPU"``), packed onto as few machines as fit them (``PACK``). Every actor is a
:class:`~kvserve.executor.worker.Worker`, as a multiprocess worker is; the ranks rendezvous at a
free port of rank 0's machine. Each step its :class:`~kvserve.runner.step_input.StepInput` goes
into the object store once and every rank's ``execute`` reads it; only rank 0 returns logits. The driver waits on
every rank, so an actor that raised, failed to start or died is a :class:`WorkerError` naming its
rank; every actor is then killed and the placement group removed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import weakref
from typing import Any

from kvserve.config import EngineConfig
from kvserve.errors import ConfigError, WorkerError
from kvserve.executor.base import Executor
from kvserve.executor.worker import START_TIMEOUT_S, Worker, free_port
from kvserve.extras import requires_extra
from kvserve.interfaces import Platform
from kvserve.runner.step_input import StepInput
from kvserve.runner.step_logits import StepLogits

logger = logging.getLogger("kvserve")

PLACEMENT_TIMEOUT_S = 120.0
"""How long the placement group may wait for the cluster's resources (an autoscaler may add nodes)."""
GRACE_S = 2.0
"""After one rank fails, how long the others get to report, so that a rank that died is named
rather than the peer whose collective it broke."""


class RayWorker(Worker):
    """The worker as a Ray actor: it also tells where rank 0's rendezvous will be."""

    def rendezvous_address(self) -> str:
        """``tcp://<this node's IP>:<a free port>``."""
        import ray

        return f"tcp://{ray.util.get_node_ip_address()}:{free_port('')}"


class RayExecutor(Executor):
    """Starts ``config.parallel.tensor_parallel_size`` actors and waits until each has its shard."""

    def __init__(self, config: EngineConfig, platform: Platform) -> None:
        with requires_extra("ray", "distributed_executor_backend='ray'"):
            import ray
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        self.ray = ray
        self.world_size = config.parallel.tensor_parallel_size
        owns_ray = not ray.is_initialized()
        if owns_ray and os.environ.get("RAY_ADDRESS"):
            ray.init()  # connects to the cluster at RAY_ADDRESS
        elif owns_ray:
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, self.world_size), include_dashboard=False)
        device = platform.ray_resource
        bundle = {"CPU": 1.0} if device is None else {"CPU": 1.0, device: 1.0}
        self.placement_group = placement_group([bundle] * self.world_size, strategy="PACK")
        self.actors: list[Any] = []
        self.pids: list[int] = []
        self._finalizer = weakref.finalize(self, _stop, ray, self.actors, self.placement_group, owns_ray)
        try:
            ready, _ = ray.wait([self.placement_group.ready()], timeout=PLACEMENT_TIMEOUT_S)
            if not ready:
                raise ConfigError(
                    f"tensor_parallel_size: the Ray cluster could not place {self.world_size} bundles of {bundle} "
                    f"within {PLACEMENT_TIMEOUT_S:.0f} s (its resources: {ray.cluster_resources()})"
                )
            actor_cls = ray.remote(RayWorker)
            for rank in range(self.world_size):
                strategy = PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=rank)
                # Ray asks for GPUs as num_gpus (and points the actor's CUDA_VISIBLE_DEVICES at its GPU).
                gpus = 1 if device == "GPU" else 0
                resources = {} if device in (None, "GPU") else {device: 1}
                options = {"num_cpus": 1, "num_gpus": gpus, "resources": resources, "scheduling_strategy": strategy}
                self.actors.append(actor_cls.options(**options).remote())
            self.pids = self._gather([actor.pid.remote() for actor in self.actors], "failed to start", START_TIMEOUT_S)
            address = self._gather([self.actors[0].rendezvous_address.remote()], "failed to start", START_TIMEOUT_S)[0]
            # Each actor sees only its own bundle's device: device 0 of its process.
            starts = [
                actor.start.remote(rank, self.world_size, 0, platform.distributed_backend, address, config)
                for rank, actor in enumerate(self.actors)
            ]
            infos = self._gather(starts, "failed to start", START_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        self.rank_infos = infos
        self.info = dataclasses.replace(infos[0], num_kv_blocks=min(i.num_kv_blocks for i in infos))
        logger.info("kvserve: %d tensor-parallel Ray actors ready (pids %s)", self.world_size, self.pids)

    def execute(self, step: StepInput) -> StepLogits:
        ref = self.ray.put(step)
        return self._gather([actor.execute.remote(ref) for actor in self.actors], "failed in a step", None)[0]

    def shutdown(self) -> None:
        self._finalizer()

    def _gather(self, refs: list[Any], doing: str, timeout: float | None) -> list[Any]:
        """Every rank's result of ``refs`` (one per rank, in rank order); the first failure raises."""
        ray = self.ray
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
            if not ready:
                self._raise(min(pending.values()), doing, f"no answer within {timeout:.0f} s")
            rank = pending.pop(ready[0])
            try:
                results[rank] = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                blamed, why = self._culprit(rank, exc, pending)
                self._raise(blamed, doing, why)
        return results

    def _culprit(self, rank: int, exc: Exception, pending: dict[Any, int]) -> tuple[int, str]:
        """The rank to blame and why: a rank whose actor died beats one whose step raised (a peer's
        collective breaks when its rank dies), then the lowest rank."""
        ray = self.ray
        failures = {rank: exc}
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=GRACE_S) if pending else ([], [])
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as other:
                failures[pending[ref]] = other
        died = [r for r, e in failures.items() if isinstance(e, ray.exceptions.RayActorError)]
        blamed = min(died or failures)
        why = _why(failures[blamed])
        others = sorted(set(failures) - {blamed})
        if others:
            why += f" (then rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} failed too)"
        return blamed, why

    def _raise(self, rank: int, doing: str, why: str) -> None:
        pid = f", pid {self.pids[rank]}" if self.pids else ""
        self.shutdown()
        raise WorkerError(f"tensor-parallel worker rank {rank} (Ray actor{pid}) {doing}: {why}")


def _why(exc: Exception) -> str:
    """One line saying what a Ray error means for its rank."""
    import ray

    if isinstance(exc, ray.exceptions.RayTaskError):  # the method raised: its own exception
        cause = exc.cause
        return f"{type(cause).__name__}: {cause}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if getattr(exc, "actor_init_failed", False):  # the actor could not be created: its traceback's last line
        return f"{type(exc).__name__}: the actor failed to start: {lines[-1]}"
    dead = next((line for line in lines if line.startswith("The actor is dead")), lines[0] if lines else "")
    return f"{type(exc).__name__}: {dead.partition(' Some common causes')[0]}"


def _stop(ray: Any, actors: list[Any], placement_group: Any, owns_ray: bool) -> None:
    """Kill every actor, remove the placement group and, if kvserve started Ray, shut it down."""
    from ray.util.placement_group import remove_placement_group

    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # already dead, or Ray is gone (interpreter exit)
            pass
    try:
        remove_placement_group(placement_group)
    except Exception:
        pass
    if owns_ray:
        ray.shutdown()
