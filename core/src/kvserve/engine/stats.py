"""Engine counters, and the periodic throughput line vLLM users know."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvserve.interfaces import KVCacheStats
from kvserve.spec_decode.speculator import SpecDecodeStats

logger = logging.getLogger("kvserve")


@dataclass(frozen=True)
class LoRAStats:
    """The adapters of the requests in the engine, by name (vLLM's ``lora_requests_info``)."""

    running: tuple[str, ...]
    """Adapters of running requests."""
    waiting: tuple[str, ...]
    """Adapters of waiting (or preempted) requests."""
    max_loras: int


@dataclass
class EngineStats:
    """A snapshot for logs and metrics endpoints."""

    num_running: int
    num_waiting: int
    kv_cache: KVCacheStats
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int
    spec_decode: SpecDecodeStats | None = None
    """Speculative decoding's counters (a copy); None when it is off."""
    lora: LoRAStats | None = None
    """The adapters in use; None when ``enable_lora`` is off."""


class StatLogger:
    """Counts tokens per step; every ``KVSERVE_STATS_INTERVAL`` seconds (default 5) logs the averages."""

    def __init__(self) -> None:
        self.interval = float(os.environ.get("KVSERVE_STATS_INTERVAL", "5"))
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.preemptions_total = 0
        self._window_prompt = self._window_generation = 0
        self._window_start = time.monotonic()
        self._spec_before = SpecDecodeStats()

    def record_step(self, prompt_tokens: int, generation_tokens: int, preemptions: int) -> None:
        self.prompt_tokens_total += prompt_tokens
        self.generation_tokens_total += generation_tokens
        self.preemptions_total += preemptions
        self._window_prompt += prompt_tokens
        self._window_generation += generation_tokens

    def maybe_log(self, snapshot: Callable[[], EngineStats]) -> None:
        """Log the window's averages when the interval has passed; ``snapshot`` is only taken then."""
        now = time.monotonic()
        elapsed = now - self._window_start
        if elapsed < self.interval:
            return
        stats = snapshot()
        if self._window_prompt or self._window_generation or stats.num_running or stats.num_waiting:
            logger.info(
                "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
                self._window_prompt / elapsed, self._window_generation / elapsed, stats.num_running,
                stats.num_waiting, 100 * stats.kv_cache.usage, 100 * stats.kv_cache.prefix_hit_rate,
            )  # fmt: skip
        if stats.spec_decode is not None:
            self._log_spec_decode(stats.spec_decode, elapsed)
        self._window_prompt = self._window_generation = 0
        self._window_start = now

    def _log_spec_decode(self, totals: SpecDecodeStats, elapsed: float) -> None:
        """vLLM's line for the window: mean acceptance length, throughputs, per-position acceptance."""
        before = self._spec_before
        drafts = totals.num_drafts - before.num_drafts
        drafted = totals.num_draft_tokens - before.num_draft_tokens
        accepted = totals.num_accepted_tokens - before.num_accepted_tokens
        self._spec_before = totals
        if not drafts:
            return
        per_position = [
            (now - (before.accepted_per_position[i] if i < len(before.accepted_per_position) else 0)) / drafts
            for i, now in enumerate(totals.accepted_per_position)
        ]
        logger.info(
            "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, Drafted "
            "throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, Per-position acceptance rate: %s, "
            "Avg Draft acceptance rate: %.1f%%",
            1 + accepted / drafts, accepted / elapsed, drafted / elapsed, accepted, drafted,
            ", ".join(f"{rate:.3f}" for rate in per_position), 100 * accepted / drafted,
        )  # fmt: skip
