"""kvserve-structured-outputs-guidance passes the structured-output backend contract."""

from kvserve.testing import StructuredOutputBackendContract


class TestGuidanceBackend(StructuredOutputBackendContract):
    backend = "guidance"
