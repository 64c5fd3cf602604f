"""Continuous-batching machinery shared by scheduler plugins."""

from kvserve.scheduling.batching import BatchingScheduler

__all__ = ["BatchingScheduler"]
