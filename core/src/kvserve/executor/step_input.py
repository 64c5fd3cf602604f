"""The compact, picklable form of one step's plan that the driver sends every worker.

It carries what ``ModelRunner`` reads of a plan: each chunk's new token ids and position range,
whether it completes its sequence, its prompt-logprobs request, and the block tables. A worker
rebuilds light stand-ins of the plan and of the KV manager's block tables from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from kvserve.interfaces import KVCacheManager, SchedulerOutput


@dataclass(frozen=True)
class ChunkInput:
    request_id: str
    start: int
    token_ids: list[int]
    """The chunk's tokens, positions ``start .. start + len(token_ids)``."""
    completes_sequence: bool
    prompt_logprobs: int | None
    num_prompt_tokens: int
    block_table: list[int]


@dataclass(frozen=True)
class StepInput:
    chunks: list[ChunkInput]

    @classmethod
    def from_plan(cls, plan: SchedulerOutput, kv_cache_manager: KVCacheManager) -> StepInput:
        chunks = []
        for item in plan.scheduled:
            request = item.request
            chunks.append(
                ChunkInput(
                    request.request_id, item.start, list(request.token_ids(item.start, item.start + item.num_tokens)),
                    item.completes_sequence, request.sampling_params.prompt_logprobs, request.num_prompt_tokens,
                    list(kv_cache_manager.block_table(request.request_id)),
                )
            )  # fmt: skip
        return cls(chunks)

    def plan(self) -> tuple[SimpleNamespace, _BlockTables]:
        """Stand-ins for the plan and the KV manager, as ``ModelRunner.execute`` reads them."""
        scheduled = [
            SimpleNamespace(
                request=_ChunkRequest(chunk), start=chunk.start, num_tokens=len(chunk.token_ids),
                completes_sequence=chunk.completes_sequence,
            )
            for chunk in self.chunks
        ]  # fmt: skip
        return SimpleNamespace(scheduled=scheduled), _BlockTables({c.request_id: c.block_table for c in self.chunks})


class _ChunkRequest:
    """The request of one chunk, holding only that chunk's tokens."""

    def __init__(self, chunk: ChunkInput) -> None:
        self.request_id = chunk.request_id
        self.sampling_params = SimpleNamespace(prompt_logprobs=chunk.prompt_logprobs)
        self.num_prompt_tokens = chunk.num_prompt_tokens
        self._chunk = chunk

    def token_ids(self, start: int, end: int) -> list[int]:
        offset = start - self._chunk.start
        return self._chunk.token_ids[offset : offset + end - start]


class _BlockTables:
    def __init__(self, tables: dict[str, list[int]]) -> None:
        self.tables = tables

    def block_table(self, request_id: str) -> list[int]:
        return self.tables[request_id]
