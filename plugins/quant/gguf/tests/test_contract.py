"""Every GGML type the method runs passes the quantization contract against gguf-py's own dequantization."""

from kvserve_quant_gguf import contract


class TestF16(contract.GGUFF16Contract):
    """F16 rows."""


class TestBF16(contract.GGUFBF16Contract):
    """BF16 rows."""


class TestQ4_0(contract.GGUFQ4_0Contract):
    """Q4_0 blocks."""


class TestQ4_1(contract.GGUFQ4_1Contract):
    """Q4_1 blocks (the embedded SmolLM2's linear layers)."""


class TestQ5_0(contract.GGUFQ5_0Contract):
    """Q5_0 blocks (Gemma-3-270M's q/k and gate/up)."""


class TestQ5_1(contract.GGUFQ5_1Contract):
    """Q5_1 blocks."""


class TestQ8_0(contract.GGUFQ8_0Contract):
    """Q8_0 blocks (Gemma-3-270M's v)."""


class TestQ4_K(contract.GGUFQ4_KContract):
    """Q4_K super-blocks."""


class TestQ5_K(contract.GGUFQ5_KContract):
    """Q5_K super-blocks."""


class TestQ6_K(contract.GGUFQ6_KContract):
    """Q6_K super-blocks."""
