"""Entry point of kvserve-platform-cpu."""

from kvserve import hookimpl


@hookimpl
def register_platforms(register):
    register("cpu", "kvserve_platform_cpu.platform:CpuPlatform", priority=0)
