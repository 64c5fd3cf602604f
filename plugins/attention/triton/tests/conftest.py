"""Without a GPU, this package's tests run the kernels in Triton's CPU interpreter.

``TRITON_INTERPRET`` is read when each ``@triton.jit`` function is defined, so it is set here,
before any test module imports the kernels.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
