"""A real uvicorn server on 127.0.0.1 (a free port) in a thread, for the server tests."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from draftless.serve.app import create_app
from draftless.serve.engine import Engine


class ServerThread:
    """Serves `engine` on 127.0.0.1:<free port> until stop()."""

    def __init__(
        self, engine: Engine, api_key: str | None = None, cors: tuple[str, ...] = ()
    ) -> None:
        self.engine = engine
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(engine, api_key=api_key, cors_origins=cors),
            log_level="warning",
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def serve_model(
    model: Any, api_key: str | None = None, cors: tuple[str, ...] = (), **engine_options: Any
) -> ServerThread:
    return ServerThread(Engine(model, **engine_options), api_key=api_key, cors=cors).start()
