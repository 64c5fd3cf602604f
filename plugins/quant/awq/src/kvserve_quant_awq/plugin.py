"""Entry point: ``[project.entry-points.kvserve] awq = "kvserve_quant_awq.plugin"``."""

from kvserve import hookimpl


@hookimpl
def register_quantization_methods(register):
    register("awq", "kvserve_quant_awq.method:AwqMethod", contract="kvserve_quant_awq.contract:AwqContract")
