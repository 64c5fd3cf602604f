"""Request guards before every route: the API key and the body size limit (plain ASGI: streams pass as they are)."""

from __future__ import annotations

import secrets

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvserve.server.errors import OpenAIError

OPEN_PATHS = frozenset({"/health", "/version"})
"""Reachable without the API key: liveness probes need no secret."""


class ApiKeyMiddleware:
    """With an API key configured, every other path needs ``Authorization: Bearer <key>``."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not secrets.compare_digest(given, self.expected):
                message = "missing or invalid API key: send 'Authorization: Bearer <key>'"
                await OpenAIError(401, message, code="invalid_api_key").response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """Refuses bodies over ``limit`` bytes with 413: by Content-Length up front, or as chunks arrive."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._too_large().response()(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise self._too_large()  # surfaces in the route, where the error handlers answer it
            return message

        await self.app(scope, counting_receive, send)

    def _too_large(self) -> OpenAIError:
        return OpenAIError(413, f"request body exceeds {self.limit} bytes", code="request_too_large")
