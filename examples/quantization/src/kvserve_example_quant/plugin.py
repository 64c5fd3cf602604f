"""Entry point: ``[project.entry-points.kvserve] example_quant = "kvserve_example_quant.plugin"``."""

from kvserve import hookimpl


@hookimpl
def register_quantization_methods(register):
    # The name is the quant_method of a checkpoint's quantization_config. The `contract` fact
    # tells `kvserve plugins check` how this format encodes weights (see contract.py).
    register(
        "example_int8",
        "kvserve_example_quant.method:Int8WeightOnlyMethod",
        contract="kvserve_example_quant.contract:Int8Contract",
    )
