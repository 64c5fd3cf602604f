"""kvserve_platform_cpu kvserve plugin package."""
