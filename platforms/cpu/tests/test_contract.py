"""kvserve-platform-cpu passes the platform contract."""

from kvserve.testing import PlatformContract


class TestCpuPlatform(PlatformContract):
    platform = "cpu"
