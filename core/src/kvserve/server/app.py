"""The FastAPI app: OpenAI routes, utility routes, guards and error handling over one ``AsyncLLM``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

import kvserve
from kvserve.config import ServerConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.server import serving_chat, serving_completions
from kvserve.server.errors import OpenAIError, install_error_handlers
from kvserve.server.metrics import HttpMetricsMiddleware
from kvserve.server.middleware import ApiKeyMiddleware, BodySizeLimitMiddleware
from kvserve.server.openapi import install_request_schemas, json_body
from kvserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    LoadLoRAAdapterRequest,
    TokenizeRequest,
    UnloadLoRAAdapterRequest,
    read_body,
)
from kvserve.server.state import ServerState

router = APIRouter()
lora_router = APIRouter()
"""The adapter routes, served only with ``allow_runtime_lora_updating`` (404 otherwise, as vLLM)."""


def _state(request: Request) -> ServerState:
    return request.app.state.server


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 while the engine runs and the server accepts requests, else 503 in OpenAI's error shape."""
    _state(request).check_ready()
    return JSONResponse({"status": "ok"})


@router.get("/version")
async def version() -> JSONResponse:
    return JSONResponse({"version": kvserve.__version__})


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    state = _state(request)
    card = {
        "id": state.model_name, "object": "model", "created": state.created, "owned_by": "kvserve",
        "root": state.llm.info.model_path, "max_model_len": state.llm.info.max_model_len,
    }  # fmt: skip
    adapters = [
        {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "kvserve",
            "root": adapter.lora_path,
            "parent": adapter.base_model_name or state.model_name,
            "max_model_len": state.llm.info.max_model_len,
        }  # fmt: skip
        for name, adapter in state.adapters.items()
    ]
    return JSONResponse({"object": "list", "data": [card, *adapters]})


@router.post("/tokenize", openapi_extra=json_body(TokenizeRequest))
async def tokenize(request: Request) -> JSONResponse:
    """Text (``prompt``) or a conversation (``messages``, through the chat template) to token ids."""
    state = _state(request)
    body = await read_body(request, TokenizeRequest)
    await state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise OpenAIError(400, "give exactly one of prompt and messages", param="prompt")
    max_model_len = state.llm.info.max_model_len
    tokenizer = state.tokenizer_for(body.model)

    def work() -> JSONResponse:  # seconds for a long text: in a worker thread, so streams go on meanwhile
        if body.messages is not None:
            tokens = serving_chat.chat_prompt(state, tokenizer, body.messages, body.add_generation_prompt)
        else:
            tokens = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        return JSONResponse({"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens})

    return await run_in_threadpool(work)


@router.post("/detokenize", openapi_extra=json_body(DetokenizeRequest))
async def detokenize(request: Request) -> JSONResponse:
    state = _state(request)
    body = await read_body(request, DetokenizeRequest)
    await state.check_model(body.model)
    vocab = state.llm.info.vocab_size
    bad = [t for t in body.tokens if not 0 <= t < vocab]
    if bad:
        raise OpenAIError(400, f"tokens: {bad[:5]} outside the vocabulary [0, {vocab})", param="tokens")
    return JSONResponse({"prompt": await run_in_threadpool(state.tokenizer_for(body.model).decode, body.tokens)})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@lora_router.post("/v1/load_lora_adapter", openapi_extra=json_body(LoadLoRAAdapterRequest))
async def load_lora_adapter(request: Request) -> PlainTextResponse:
    """Serve the PEFT adapter in ``lora_path`` as the model ``lora_name`` (read and checked now: 400 naming
    the problem); it is listed in ``/v1/models`` from now on."""
    body = await read_body(request, LoadLoRAAdapterRequest)
    state = _state(request)
    state.check_ready()
    await state.load_adapter(body.lora_name, body.lora_path)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@lora_router.post("/v1/unload_lora_adapter", openapi_extra=json_body(UnloadLoRAAdapterRequest))
async def unload_lora_adapter(request: Request) -> PlainTextResponse:
    """Stop serving adapter ``lora_name`` (404 if it is not served): requests already admitted finish with
    it; the engine frees it after the last one."""
    body = await read_body(request, UnloadLoRAAdapterRequest)
    state = _state(request)
    state.check_ready()
    await state.unload_adapter(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


def build_app(llm: AsyncLLM, config: ServerConfig, model_name: str | None = None) -> FastAPI:
    """The server for ``llm``; ``model_name`` is what clients call it unless ``config.served_model_name`` says."""
    state = ServerState(llm, config, model_name)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        state.accepting = False  # the engine itself is shut down by whoever started it

    app = FastAPI(title="kvserve", version=kvserve.__version__, lifespan=lifespan)
    app.state.server = state
    routers = (router, serving_completions.router, serving_chat.router)
    if config.allow_runtime_lora_updating:
        routers += (lora_router,)
    for routes in routers:
        app.include_router(routes)
    install_error_handlers(app)
    schemas = [CompletionRequest, ChatCompletionRequest, TokenizeRequest, DetokenizeRequest]
    if config.allow_runtime_lora_updating:
        schemas += [LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest]
    install_request_schemas(app, schemas)
    # Outermost last: metrics see every response, guards run before any route reads the body.
    app.add_middleware(BodySizeLimitMiddleware, limit=int(config.max_request_body_bytes))
    if config.api_key is not None:  # never empty: ServerConfig reads an empty key as none
        app.add_middleware(ApiKeyMiddleware, api_key=config.api_key.get_secret_value())
    paths = {route.path for routes in routers for route in routes.routes}  # type: ignore[attr-defined]
    app.add_middleware(HttpMetricsMiddleware, metrics=state.metrics, paths=paths)
    return app
