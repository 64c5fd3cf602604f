"""Running the server with uvicorn: ``kvserve serve`` in the foreground, or a background thread.

Graceful shutdown is uvicorn's: on SIGINT/SIGTERM it stops accepting connections, lets
in-flight responses finish for up to ``shutdown_timeout`` seconds, then cancels the rest
(which aborts their engine requests); the engine is shut down last.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI
from rich.console import Console

from kvserve.config import EngineConfig, ServerConfig
from kvserve.frontend.async_llm import AsyncLLM
from kvserve.loader.default_model import EMBEDDED_MODEL_NAME
from kvserve.server.app import build_app


def load_engine(config: EngineConfig) -> AsyncLLM:
    """Build the engine behind a spinner: loading takes seconds (the first run also converts the embedded model)."""
    with Console(stderr=True).status(f"Loading {config.model.model or EMBEDDED_MODEL_NAME} ..."):
        return AsyncLLM.from_config(config)


def _uvicorn_config(app: FastAPI, config: ServerConfig, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app, host=config.host, port=config.port, log_level=log_level,
        timeout_graceful_shutdown=config.shutdown_timeout,  # type: ignore[arg-type]  # any number works
    )  # fmt: skip


def serve(config: EngineConfig, log_level: str = "info") -> None:
    """Load the model and serve it until SIGINT or SIGTERM."""
    llm = load_engine(config)
    try:
        app = build_app(llm, config.server, config.model.model)
        server = uvicorn.Server(_uvicorn_config(app, config.server, log_level))
        # uvicorn re-raises the signal it handled once its graceful shutdown is over; by then
        # there is nothing left to interrupt, so SIGTERM is ignored and SIGINT's KeyboardInterrupt caught.
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        llm.shutdown()


class ServerThread:
    """``with ServerThread(app) as server: httpx.get(server.url + "/health")``.

    uvicorn serving ``app`` on a free loopback port in a background thread, for tests and
    benchmarks; leaving the block shuts it down gracefully (the app's engine stays up).
    """

    def __init__(self, app: FastAPI, config: ServerConfig | None = None, log_level: str = "warning") -> None:
        self.config = config or ServerConfig(port=0)
        self.app = app
        self.server = uvicorn.Server(_uvicorn_config(app, self.config, log_level))
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.thread = threading.Thread(target=self._run, name="kvserve-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()
        return f"http://{host}:{port}"

    def _run(self) -> None:
        self.server.run(sockets=[self.socket])

    def __enter__(self) -> ServerThread:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((self.config.host, self.config.port))
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread exited during startup; see its log")
            time.sleep(0.01)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=self.config.shutdown_timeout + 5)
        self.socket.close()
