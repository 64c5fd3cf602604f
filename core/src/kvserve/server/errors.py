"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, and never a stack trace.

Status codes: 400 a request the engine cannot serve as asked (malformed JSON, out-of-range or
non-finite values, over a server limit, a field kvserve cannot honour, too long for
``max_model_len``, masks that together rule out every token, a grammar that does not compile),
401 a missing or wrong API key, 404 an unknown model, route or LoRA adapter to unload, 413 a body over the size limit,
422 a body of the wrong shape (wrong types, unknown or missing fields), 429 too many sequences in
flight, 503 an engine that is not running.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvserve.errors import CapacityError, EngineDeadError, RequestError

logger = logging.getLogger("kvserve")

_TYPES = {401: "authentication_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}
# Pydantic puts the union member it tried into an error's location; clients know only field names.
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}
# Pydantic error types of a value of the right type out of its range (an int beyond int64, an infinite float).
_OUT_OF_RANGE = {"finite_number", "less_than", "less_than_equal", "greater_than", "greater_than_equal"}


class OpenAIError(Exception):
    """An error to send to the client as it is; ``param`` names the offending request field."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, type: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def request_shape_error(exc: ValidationError) -> OpenAIError:
    """A body that failed to parse into the endpoint's request model: 400 for bad JSON, else 422."""
    errors = exc.errors(include_url=False)
    if any(err["type"] == "json_invalid" for err in errors):
        return OpenAIError(400, f"malformed JSON body: {errors[0]['msg']}", code="invalid_json")
    problems: dict[str, str] = {}  # one message per top-level field: a union reports each member it tried
    for err in errors:
        path = [str(p) for p in err["loc"] if p not in _UNION_TAGS and "[" not in str(p)]
        where = ".".join(path) or "body"
        message = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        problems.setdefault(path[0] if path else "body", f"{where}: {message}")
    first = next(iter(problems))
    param = None if first == "body" else first
    if all(err["type"] in _OUT_OF_RANGE for err in errors):  # the right type, a value no client may send
        return OpenAIError(400, "; ".join(problems.values()), param=param, code="invalid_value")
    return OpenAIError(422, "; ".join(problems.values()), param=param, code="invalid_type")


def invalid_value_error(exc: ValidationError, renames: Mapping[str, str] | None = None) -> OpenAIError:
    """SamplingParams rejected a value: 400 naming the field as the client called it."""
    err = exc.errors(include_url=False)[0]
    field = str(err["loc"][0]) if err["loc"] else None
    param = (renames or {}).get(field, field) if field else None
    message = str(err["msg"]).removeprefix("Value error, ")
    return OpenAIError(400, f"{param}: {message}" if param else message, param=param, code="invalid_value")


def engine_dead() -> OpenAIError:
    """503: the engine loop has died (its error is in the server log); only a restart helps."""
    return OpenAIError(503, "the engine is not running; the server must be restarted", code="engine_dead")


def field_error(message: str, renames: Mapping[str, str] | None = None, code: str = "invalid_value") -> OpenAIError:
    """400 for a ``"field: why"`` message: the field (a name, or a dotted path such as
    ``structured_outputs.regex``) as the client called it (``renames``), ``param`` its top-level name."""
    field, sep, why = message.partition(": ")
    if not sep or not all(part.isidentifier() for part in field.split(".")):
        return OpenAIError(400, message, code=code)
    field = (renames or {}).get(field, field)
    return OpenAIError(400, f"{field}: {why}", param=field.split(".")[0], code=code)


def engine_error(exc: Exception, renames: Mapping[str, str] | None = None) -> OpenAIError:
    """What the engine raised about a request, for the client: 400 (naming the field, as ``renames`` has
    it) or 503."""
    if isinstance(exc, EngineDeadError):
        return engine_dead()
    code = "context_length_exceeded" if isinstance(exc, CapacityError) else "invalid_value"
    error = field_error(str(exc), renames, code)
    if error.param == "prompt_token_ids":  # what the client sent as ``prompt``
        error.param = "prompt"
    return error


def as_openai_error(exc: Exception) -> OpenAIError:
    """Any exception as the error a client may see; an unexpected one is logged here and not described."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, EngineDeadError):
        return engine_dead()
    if isinstance(exc, RequestError) and getattr(exc.output, "invalid_request", False):
        message = exc.output.error  # type: ignore[union-attr]  # its own parameters: the client may fix them
        return OpenAIError(400, f"the request cannot be served as asked: {message}", code="invalid_request")
    if isinstance(exc, RequestError):  # the engine failed this request only, and logged why
        return OpenAIError(500, "the engine failed this request; the server log has the details", code="request_failed")
    logger.error("internal error while serving a request", exc_info=exc)
    return _internal_error()


def _internal_error() -> OpenAIError:
    return OpenAIError(500, "internal server error; the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves the server in OpenAI's shape."""

    async def known_error(request: Request, exc: Exception) -> JSONResponse:
        return as_openai_error(exc).response()

    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return OpenAIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code).response()

    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette re-raises it after this response, so uvicorn logs the traceback.
        return _internal_error().response()

    app.add_exception_handler(OpenAIError, known_error)
    app.add_exception_handler(EngineDeadError, known_error)
    app.add_exception_handler(RequestError, known_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
