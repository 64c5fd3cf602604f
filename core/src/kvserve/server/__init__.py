"""The OpenAI-compatible HTTP server (FastAPI + uvicorn) over ``AsyncLLM``: ``kvserve serve``."""

from kvserve.extras import requires_extra

with requires_extra("server", "the HTTP server (kvserve serve, kvserve.server)"):
    from kvserve.server.app import build_app
    from kvserve.server.runner import ServerThread, serve

__all__ = ["ServerThread", "build_app", "serve"]
