"""AWQ passes the quantization contract at every supported group size."""

from typing import ClassVar

from kvserve_quant_awq.contract import AwqContract


class TestAwqGroup128(AwqContract):
    """group_size 128: int4 CPU matmul for bf16, dequantized per matmul for fp16/fp32."""


class TestAwqGroup64(AwqContract):
    """group_size 64 (SmolLM2's 576 hidden features)."""

    quant_config: ClassVar[dict] = {**AwqContract.quant_config, "group_size": 64}
    shapes = ((192, 64), (576, 96))


class TestAwqGroup32(AwqContract):
    """group_size 32."""

    quant_config: ClassVar[dict] = {**AwqContract.quant_config, "group_size": 32}
    shapes = ((96, 64), (256, 48))
