"""kvserve_scheduler_fifo kvserve plugin package."""
