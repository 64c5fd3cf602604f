"""Entry point: ``[project.entry-points.kvserve] fp8 = "kvserve_quant_fp8.plugin"``."""

from kvserve import hookimpl


@hookimpl
def register_quantization_methods(register):
    register("fp8", "kvserve_quant_fp8.fp8_method:Fp8Method", contract="kvserve_quant_fp8.contract:Fp8Contract")
    register(
        "compressed-tensors",
        "kvserve_quant_fp8.compressed_tensors_method:CompressedTensorsFp8Method",
        contract="kvserve_quant_fp8.contract:CompressedTensorsFp8Contract",
    )
