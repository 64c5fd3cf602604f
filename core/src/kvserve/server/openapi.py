"""The request bodies in ``/openapi.json``.

The routes read their bodies themselves (strictly, with OpenAI-shaped errors), so FastAPI
does not see the models; each route names its model with :func:`json_body` and
:func:`install_request_schemas` adds the models' JSON schemas to the document's components.
Clients and fuzzers (schemathesis) then get the real request shapes.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

_REF = "#/components/schemas/{model}"


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """A route's ``openapi_extra``: a required JSON body of ``model`` (installed by :func:`install_request_schemas`)."""
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def install_request_schemas(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Make ``app.openapi()`` include the schemas of ``models`` (and of the models they use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _, defs = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
            document.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to customize the schema
