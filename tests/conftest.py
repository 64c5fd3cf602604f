import logging
import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("KVSERVE_LOG_LEVEL", "WARNING")


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


# Triton's interpreter must be on before triton is first imported (its own tl.max, tl.sum...
# are @triton.jit functions): without a GPU, the Triton backend's end-to-end tests run in it.
if _no_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def startup_lines():
    """Messages the kvserve logger emits at INFO and above during the test (the engine's start-up line among them)."""
    from kvserve.logging_setup import configure_logging

    configure_logging()
    logger = logging.getLogger("kvserve")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)
