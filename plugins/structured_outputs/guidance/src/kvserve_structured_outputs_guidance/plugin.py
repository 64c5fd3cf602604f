"""Entry point of kvserve-structured-outputs-guidance."""

from kvserve import hookimpl
from kvserve_structured_outputs_guidance.library import LLGUIDANCE


@hookimpl
def register_structured_output_backends(register):
    # Listed even without llguidance: ``kvserve plugins`` shows the reason, using it raises it.
    register(
        "guidance",
        "kvserve_structured_outputs_guidance.backend:GuidanceBackend",
        priority=10,
        unavailable=LLGUIDANCE.missing_reason(),
    )
