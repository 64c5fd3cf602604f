"""The example quantization method passes its contract (the plugin ships the format's reference)."""

from kvserve_example_quant.contract import Int8Contract


class TestInt8WeightOnlyMethod(Int8Contract):
    """Runs every check of QuantizationMethodContract with the int8 reference of Int8Contract."""
