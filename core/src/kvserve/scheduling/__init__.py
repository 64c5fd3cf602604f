"""Continuous-batching machinery shared by scheduler plugins, and core's admission rules."""

from kvserve.scheduling.admission import DistinctKeyLimit
from kvserve.scheduling.batching import BatchingScheduler

__all__ = ["BatchingScheduler", "DistinctKeyLimit"]
