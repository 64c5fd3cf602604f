"""kvserve-structured-outputs-xgrammar passes the structured-output backend contract."""

from kvserve.testing import StructuredOutputBackendContract


class TestXgrammarBackend(StructuredOutputBackendContract):
    backend = "xgrammar"
