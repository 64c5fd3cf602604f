"""Entry point of kvserve-platform-cuda: registers by name only; torch.cuda is touched when the platform is used."""

from kvserve import hookimpl


@hookimpl
def register_platforms(register):
    # Above the CPU platform (priority 0): under platform="auto" a visible GPU is used first.
    register("cuda", "kvserve_platform_cuda.platform:CudaPlatform", priority=10)
