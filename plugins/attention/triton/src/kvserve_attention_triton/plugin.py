"""Entry point of kvserve-attention-triton: registers the backend without importing triton."""

from kvserve import hookimpl


@hookimpl
def register_attention_backends(register):
    register(
        "triton",
        "kvserve_attention_triton.backend:TritonAttentionBackend",
        priority=20,
        contract="kvserve_attention_triton.contract:TritonAttentionContract",
    )
