"""kvserve_platform_cuda kvserve plugin package."""
