"""Entry point of kvserve-attention-cpu."""

from kvserve import hookimpl


@hookimpl
def register_attention_backends(register):
    register("cpu", "kvserve_attention_cpu.backend:CpuAttentionBackend", priority=10)
