"""kvserve_scheduler_priority kvserve plugin package."""
