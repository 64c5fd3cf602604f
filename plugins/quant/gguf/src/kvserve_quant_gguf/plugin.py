"""Entry point: ``[project.entry-points.kvserve] gguf = "kvserve_quant_gguf.plugin"``."""

from kvserve import hookimpl


@hookimpl
def register_quantization_methods(register):
    # The contract of the embedded SmolLM2's type; the plugin's tests run one per GGML type.
    register(
        "gguf", "kvserve_quant_gguf.method:GGUFLinearMethod", contract="kvserve_quant_gguf.contract:GGUFQ4_1Contract"
    )
