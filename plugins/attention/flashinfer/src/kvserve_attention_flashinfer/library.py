"""The FlashInfer versions this backend is written for."""

from kvserve.optional_library import OptionalLibrary

# ``plan()``/``run()`` exist since 0.2.0, and the argument names this backend passes are the
# same from 0.2.0 to 0.7.
FLASHINFER = OptionalLibrary(
    distribution="flashinfer-python",
    name="flashinfer",
    minimum=(0, 2),
    below=(0, 8),
    install="pip install kvserve-attention-flashinfer[gpu]",
)
