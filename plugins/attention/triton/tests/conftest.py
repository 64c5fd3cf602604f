"""Without a GPU, this package's tests run the kernels in Triton's CPU interpreter.

``TRITON_INTERPRET`` is read when each ``@triton.jit`` function is defined, triton's own
(``tl.max``, ``tl.sum``...) included, so it is set here, before anything imports triton.
"""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

# the shared case builder (triton_cases.py) is imported by name from this folder
sys.path.insert(0, str(Path(__file__).parent))
