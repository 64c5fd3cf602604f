"""The multiprocess executor: one spawned worker process per tensor-parallel rank on this machine.

Every worker is a :class:`~kvserve.executor.worker.Worker` (the group over the platform's
backend, its shard, one torch thread; rank ``r`` drives the machine's device ``r``). Each step
the driver pickles the step's :class:`~kvserve.runner.step_input.StepInput` once to every rank;
only rank 0 sends logits back. The driver watches every worker's pipe and process: a worker that fails or dies is a
:class:`WorkerError` naming its rank, and every worker is then stopped, so none outlives the
engine.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
import weakref
from multiprocessing.connection import Connection, wait
from typing import Any

import torch.multiprocessing as mp

from kvserve.config import EngineConfig
from kvserve.errors import WorkerError
from kvserve.executor.base import Executor
from kvserve.executor.worker import START_TIMEOUT_S, Worker, free_port
from kvserve.runner.step_input import StepInput
from kvserve.runner.step_logits import StepLogits

logger = logging.getLogger("kvserve")


class MultiprocExecutor(Executor):
    """Spawns ``config.parallel.tensor_parallel_size`` workers and waits until each has its shard."""

    def __init__(self, config: EngineConfig, distributed_backend: str) -> None:
        self.world_size = config.parallel.tensor_parallel_size
        context = mp.get_context("spawn")
        init_method = f"tcp://127.0.0.1:{free_port()}"
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self.pending: dict[int, list[tuple[str, Any]]] = {rank: [] for rank in range(self.world_size)}
        """Messages read while waiting for another rank's."""
        for rank in range(self.world_size):
            driver_end, worker_end = context.Pipe()
            proc = context.Process(
                target=worker_main, name=f"kvserve-tp-rank{rank}", daemon=True,
                args=(rank, self.world_size, distributed_backend, init_method, config, worker_end),
            )  # fmt: skip
            proc.start()
            worker_end.close()
            self.conns.append(driver_end)
            self.procs.append(proc)
        self._finalizer = weakref.finalize(self, _stop, self.procs, self.conns)
        try:
            infos = [self._receive(r, "ready", "failed to start", START_TIMEOUT_S) for r in range(self.world_size)]
        except BaseException:
            self.shutdown()
            raise
        self.rank_infos = infos
        self.info = dataclasses.replace(infos[0], num_kv_blocks=min(i.num_kv_blocks for i in infos))
        logger.info("kvserve: %d tensor-parallel workers ready (pids %s)", self.world_size, [p.pid for p in self.procs])

    def execute(self, step: StepInput) -> StepLogits:
        self._broadcast(("step", step))
        return self._receive(0, "logits", "failed in a step", None)

    def shutdown(self) -> None:
        self._finalizer()

    def _broadcast(self, message: tuple[str, Any]) -> None:
        payload = pickle.dumps(message)
        for rank, conn in enumerate(self.conns):
            try:
                conn.send_bytes(payload)
            except (BrokenPipeError, ConnectionError, OSError):
                self._raise(rank, "failed in a step", self._death(rank))

    def _receive(self, rank: int, kind: str, doing: str, timeout: float | None) -> Any:
        """The next ``kind`` message from ``rank``, watching every worker meanwhile."""
        watched = {conn: r for r, conn in enumerate(self.conns)} | {p.sentinel: r for r, p in enumerate(self.procs)}
        while True:
            if self.pending[rank]:
                got, payload = self.pending[rank].pop(0)
                if got == kind:
                    return payload
            ready = wait(list(watched), timeout)
            if not ready:
                self._raise(rank, doing, f"no answer within {timeout:.0f} s")
            for obj in ready:
                r = watched[obj]
                if obj is not self.conns[r]:  # a process sentinel: it exited
                    if not self.conns[r].poll():
                        self._raise(r, doing, self._death(r))
                    continue
                try:
                    got, payload = pickle.loads(obj.recv_bytes())
                except (EOFError, OSError):
                    self._raise(r, doing, self._death(r))
                if got == "error":
                    self._raise(r, doing, payload)
                self.pending[r].append((got, payload))

    def _death(self, rank: int) -> str:
        proc = self.procs[rank]
        proc.join(timeout=1.0)
        return f"its process (pid {proc.pid}) exited with code {proc.exitcode}"

    def _raise(self, rank: int, doing: str, why: str) -> None:
        self.shutdown()
        raise WorkerError(f"tensor-parallel worker rank {rank} {doing}: {why}")


def _stop(procs: list[Any], conns: list[Connection]) -> None:
    """Ask every worker to stop, then terminate and kill what is left."""
    stop = pickle.dumps(("stop", None))
    for conn in conns:
        try:
            conn.send_bytes(stop)
        except (BrokenPipeError, ConnectionError, OSError):
            pass
    for proc in procs:
        proc.join(timeout=2.0)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=2.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for conn in conns:
        conn.close()


def worker_main(
    rank: int, world_size: int, backend: str, init_method: str, config: EngineConfig, conn: Connection
) -> None:
    """One rank (a :class:`Worker` with the rank's own device): start, then run step inputs until
    told to stop (or the driver's end of the pipe closes)."""
    worker = Worker()

    def send(kind: str, payload: Any) -> None:
        conn.send_bytes(pickle.dumps((kind, payload)))

    try:
        send("ready", worker.start(rank, world_size, rank, backend, init_method, config))
        while True:
            kind, payload = pickle.loads(conn.recv_bytes())
            if kind == "stop":
                break
            step = worker.execute(payload)
            if step is not None:
                send("logits", step)
    except EOFError:  # the driver went away
        pass
    except Exception as exc:
        logging.getLogger("kvserve").exception("tensor-parallel worker rank %d failed", rank)
        try:
            send("error", f"{type(exc).__name__}: {exc}")
        except OSError:
            pass
    finally:
        worker.stop()
