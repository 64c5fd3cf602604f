"""Entry point of kvserve-structured-outputs-xgrammar."""

from kvserve import hookimpl
from kvserve_structured_outputs_xgrammar.library import XGRAMMAR


@hookimpl
def register_structured_output_backends(register):
    # Listed even without xgrammar: ``kvserve plugins`` shows the reason, using it raises it.
    register(
        "xgrammar",
        "kvserve_structured_outputs_xgrammar.backend:XgrammarBackend",
        priority=20,
        unavailable=XGRAMMAR.missing_reason(),
    )
