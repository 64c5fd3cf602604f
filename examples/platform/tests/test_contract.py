"""The example platform passes the platform contract."""

from kvserve.testing import PlatformContract


class TestFixedBudgetCpuPlatform(PlatformContract):
    platform = "example_cpu"
