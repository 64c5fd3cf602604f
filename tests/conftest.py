import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("KVSERVE_LOG_LEVEL", "WARNING")


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


# Triton's interpreter must be on before triton is first imported (its own tl.max, tl.sum...
# are @triton.jit functions): without a GPU, the Triton backend's end-to-end tests run in it.
if _no_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")
