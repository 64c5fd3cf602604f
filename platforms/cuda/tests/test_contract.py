"""kvserve-platform-cuda passes the platform contract (class facts everywhere; the rest where CUDA is)."""

from kvserve.testing import PlatformContract


class TestCudaPlatform(PlatformContract):
    platform = "cuda"
