"""Tool calling: core's tool parsers, the grammars that force a call, and the glue to chat templates.

The parsers (``hermes``, ``llama3_json``, ``mistral``, ``pythonic``) implement
:class:`kvserve.interfaces.ToolParser` and are registered as core's built-in ``tool_parser`` plugins.
"""
