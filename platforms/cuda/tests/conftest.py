"""Without a GPU, the Triton LoRA kernel's tests run it in Triton's CPU interpreter.

``TRITON_INTERPRET`` is read when each ``@triton.jit`` function is defined, triton's own
(``tl.sum``...) included, so it is set here, before anything imports triton.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
