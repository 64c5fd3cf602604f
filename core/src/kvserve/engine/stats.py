"""Engine counters, and the periodic throughput line vLLM users know."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvserve.interfaces import KVCacheStats

logger = logging.getLogger("kvserve")


@dataclass
class EngineStats:
    """A snapshot for logs and metrics endpoints."""

    num_running: int
    num_waiting: int
    kv_cache: KVCacheStats
    prompt_tokens_total: int
    generation_tokens_total: int
    preemptions_total: int


class StatLogger:
    """Counts tokens per step; every ``KVSERVE_STATS_INTERVAL`` seconds (default 5) logs the averages."""

    def __init__(self) -> None:
        self.interval = float(os.environ.get("KVSERVE_STATS_INTERVAL", "5"))
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.preemptions_total = 0
        self._window_prompt = self._window_generation = 0
        self._window_start = time.monotonic()

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
        self._window_prompt = self._window_generation = 0
        self._window_start = now
