"""Entry point: ``[project.entry-points.kvserve] example_attention = "kvserve_example_attention.plugin"``."""

from kvserve import hookimpl


@hookimpl
def register_attention_backends(register):
    # Below the real CPU backend (priority 10): attention_backend="auto" keeps the fast one.
    register("naive", "kvserve_example_attention.backend:NaiveAttentionBackend", priority=-10)
