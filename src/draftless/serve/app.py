"""The HTTP layer (FastAPI): parse a request, queue it on the engine, answer or stream.

Nothing here touches the model; see engine.py for the one place concurrency is decided.
Every error is OpenAI-shaped, `{"error": {"message", "type", "param", "code"}}`: 400 for a bad
request (malformed JSON, a field of the wrong type or range, a prompt past the context), 401
for a missing or wrong API key (when the server has one), 404 for an unknown path, 503 while
shutting down, 500 for a bug (whose traceback is logged).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException

from draftless.errors import UserError
from draftless.sampling import OptionsError
from draftless.serve import protocol as wire
from draftless.serve.engine import (
    CallDeltas,
    Cancelled,
    Engine,
    Finished,
    Job,
    Piece,
    ServerClosing,
    Started,
)

log = logging.getLogger("draftless.serve")
DISCONNECT_POLL = 0.25  # seconds between checks that a waiting client is still there
ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models"})


class ClientGone(Exception):
    pass


def error_response(err: BaseException) -> JSONResponse:
    if isinstance(err, ServerClosing | Cancelled):
        body = wire.error_body(str(err) or "cancelled", type="server_error", code="unavailable")
        return JSONResponse(body, status_code=503)
    if isinstance(err, wire.RequestError):
        return JSONResponse(wire.error_body(str(err), param=err.param, code=err.code), 400)
    if isinstance(err, UserError | OptionsError):
        return JSONResponse(wire.error_body(str(err)), status_code=400)
    log.error("request failed", exc_info=err)
    body = wire.error_body(f"internal error: {type(err).__name__}", type="server_error")
    return JSONResponse(body, status_code=500)


# pydantic's names for the branches of a union in an error's location ("str",
# "list[TextPart]", "function-after[...]"): not part of the request's field path.
_UNION_BRANCH = frozenset({"str", "int", "float", "bool", "list", "dict"})


def _param(loc: Sequence[object]) -> str | None:
    """The request field an error's location names: "messages.0.content"."""
    parts = [
        str(part)
        for part in loc
        if part != "body" and str(part) not in _UNION_BRANCH and "[" not in str(part)
    ]
    return ".".join(parts) or None


# With an API key, what it guards: the OpenAI API. /health stays open for load balancers and
# /metrics for scrapers (as vLLM does), neither of which sees a prompt or an answer.
GUARDED_PREFIX = "/v1/"


def _bearer_matches(header: str | None, key: bytes) -> bool:
    """Whether an Authorization header is "Bearer <key>" (compared in constant time)."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return secrets.compare_digest(token.strip().encode(), key)


def create_app(
    engine: Engine, api_key: str | None = None, cors_origins: Sequence[str] = ()
) -> FastAPI:
    """The app serving `engine`; with `api_key`, every /v1/ request must carry it as
    `Authorization: Bearer <api_key>` (what the openai client sends as its api_key). With
    `cors_origins` ("*" for any), a web page served from one of them may call the API from
    the browser (CORS): its preflight is answered before the key is checked, and every answer,
    a 401 too, carries the headers that let the page read it."""
    model_name = engine.model.name
    metrics = engine.metrics

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(engine.close)  # cancels what still waits; joins the worker

    app = FastAPI(title="draftless", lifespan=lifespan)

    if api_key:
        key = api_key.encode()

        @app.middleware("http")
        async def authorize(
            request: Request, call_next: Callable[[Request], Awaitable[Response]]
        ) -> Response:
            path = request.url.path
            if path.startswith(GUARDED_PREFIX) and not _bearer_matches(
                request.headers.get("authorization"), key
            ):
                if path in ENDPOINTS:
                    metrics.requests.labels(path, "401").inc()
                message = "a valid API key is needed: send it as 'Authorization: Bearer <key>'"
                body = wire.error_body(message, code="invalid_api_key")
                return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            return await call_next(request)

    if cors_origins:  # added last, so outermost: it sees a preflight before the key check
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
            max_age=600,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        # A union field (a message's content: text or parts) reports every branch's error;
        # the one our own validators raised says what is wrong.
        first = next((e for e in errors if e.get("type") == "value_error"), None)
        first = first or (errors[0] if errors else {})
        param = _param(first.get("loc", ()))
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        if first.get("type") == "json_invalid":
            message, param = f"malformed JSON: {first.get('ctx', {}).get('error', message)}", None
        elif param:
            message = f"{param}: {message}"
        endpoint = request.url.path
        metrics.requests.labels(endpoint, "400").inc()
        return JSONResponse(wire.error_body(message, param=param), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = wire.error_body(str(exc.detail), type=kind)
        return JSONResponse(body, status_code=exc.status_code)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not engine.alive:
            return JSONResponse({"status": "unavailable"}, status_code=503)
        return JSONResponse({"status": "ok", "model": model_name, "spec": engine.spec})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        entry = {"id": model_name, "object": "model", "created": 0, "owned_by": "draftless"}
        return {"object": "list", "data": [entry]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/chat/completions")
    async def chat(body: wire.ChatRequest, request: Request) -> Response:
        return await serve(body, request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(body: wire.CompletionRequest, request: Request) -> Response:
        return await serve(body, request, "/v1/completions")

    async def serve(
        params: wire.ChatRequest | wire.CompletionRequest, request: Request, endpoint: str
    ) -> Response:
        # One job per choice (n), queued together so they run back to back; each is a
        # request of its own to the engine (the next reuses the prompt's cache rows).
        loop = asyncio.get_running_loop()
        jobs = [Job(one, loop) for one in params.choices()]
        try:
            for job in jobs:
                engine.submit(job)
        except ServerClosing as err:
            for job in jobs:
                job.cancelled.set()
            return answer(endpoint, error_response(err))
        handed_over = False
        try:
            first = await receive(jobs[0], request)
            if not isinstance(first, Started):
                return answer(endpoint, error_response(first))
            if params.stream:
                handed_over = True  # the event stream owns the jobs from here
                return EventSourceResponse(events(jobs, params, endpoint), ping=15)
            done: list[Finished] = []
            for i, job in enumerate(jobs):
                item = first if i == 0 else await receive(job, request)
                while not isinstance(item, Finished | BaseException):
                    item = await receive(job, request)
                if isinstance(item, BaseException):
                    return answer(endpoint, error_response(item))
                done.append(item)
            metrics.latency.observe(time.perf_counter() - jobs[0].arrived)
            return answer(endpoint, JSONResponse(whole(params, done)))
        except ClientGone:
            return answer(endpoint, JSONResponse(wire.error_body("client gone"), 499))
        finally:
            if not handed_over:
                for job in jobs:
                    job.cancelled.set()  # a no-op once finished; frees the model otherwise

    async def receive(job: Job, request: Request) -> Any:
        """The next item from the worker; ClientGone if the client disconnects meanwhile."""
        while True:
            try:
                return await asyncio.wait_for(job.channel.get(), DISCONNECT_POLL)
            except TimeoutError:
                if await request.is_disconnected():
                    raise ClientGone from None

    def answer(endpoint: str, response: JSONResponse) -> JSONResponse:
        metrics.requests.labels(endpoint, str(response.status_code)).inc()
        return response

    def whole(
        params: wire.ChatRequest | wire.CompletionRequest, done: list[Finished]
    ) -> dict[str, Any]:
        chat = isinstance(params, wire.ChatRequest)
        rid = wire.new_id("chatcmpl" if chat else "cmpl")
        return wire.response(
            chat,
            rid,
            model_name,
            [(f.text, f.finish_reason, f.logprobs, f.tool_calls) for f in done],
            total_usage(done),
            choice_stats(done),
        )

    def total_usage(done: list[Finished]) -> dict[str, int]:
        """The prompt once (as OpenAI counts n choices), the completions of every choice."""
        return wire.usage(done[0].prompt_tokens, sum(f.completion_tokens for f in done))

    def choice_stats(done: list[Finished]) -> dict[str, Any]:
        """The `draftless` object: the one choice's stats, or {"choices": [each one's]}."""
        return done[0].stats if len(done) == 1 else {"choices": [f.stats for f in done]}

    async def events(
        jobs: list[Job],
        params: wire.ChatRequest | wire.CompletionRequest,
        endpoint: str,
    ) -> AsyncIterator[dict[str, str]]:
        is_chat = isinstance(params, wire.ChatRequest)
        rid = wire.new_id("chatcmpl" if is_chat else "cmpl")

        # With include_usage, OpenAI's chunks carry "usage": null until a last chunk of
        # their own; without it, the chunk that finishes the last choice carries the usage.
        usage_chunk = params.usage_chunk

        def chunk(
            index: int,
            text: str | None,
            finish: str | None = None,
            extra: Any = None,
            logprobs: Any = None,
        ) -> dict[str, str]:
            return choice_chunk(
                wire.chunk(is_chat, rid, model_name, text, finish, extra, logprobs, index)
            )

        def choice_chunk(body: dict[str, Any]) -> dict[str, str]:  # any chunk of a choice
            if usage_chunk:
                body["usage"] = None
            return data(body)

        def data(body: dict[str, Any]) -> dict[str, str]:
            return {"data": json.dumps(body, ensure_ascii=False)}

        done: list[Finished] = []
        try:
            for index, job in enumerate(jobs):
                item = None if index == 0 else await job.channel.get()  # job 0's Started: read
                if isinstance(item, BaseException):  # e.g. cancelled: the server shuts down
                    reply = error_response(item)
                    yield {"data": bytes(reply.body).decode()}
                    metrics.requests.labels(endpoint, str(reply.status_code)).inc()
                    return
                if is_chat:
                    yield chunk(index, None)  # the role, before any text
                while True:
                    item = await job.channel.get()
                    if isinstance(item, str):
                        yield chunk(index, item)
                    elif isinstance(item, Piece):
                        yield chunk(index, item.text, logprobs=item.logprobs)
                    elif isinstance(item, CallDeltas):
                        deltas = wire.call_deltas_chunk(rid, model_name, item.deltas, index)
                        yield choice_chunk(deltas)
                    elif isinstance(item, Finished):
                        if item.tool_calls and not item.calls_sent:
                            calls = wire.tool_calls_chunk(rid, model_name, item.tool_calls, index)
                            yield choice_chunk(calls)
                        done.append(item)
                        last = len(done) == len(jobs)
                        use = total_usage(done)
                        extra = {"usage": use, "draftless": choice_stats(done)} if last else None
                        yield chunk(index, "", item.finish_reason, extra, item.logprobs)
                        break
                    elif isinstance(item, BaseException):  # after the headers: an error event
                        reply = error_response(item)
                        yield {"data": bytes(reply.body).decode()}
                        metrics.requests.labels(endpoint, str(reply.status_code)).inc()
                        return
            if usage_chunk:
                yield data(wire.usage_chunk(is_chat, rid, model_name, total_usage(done)))
            yield {"data": "[DONE]"}
            metrics.latency.observe(time.perf_counter() - jobs[0].arrived)
            metrics.requests.labels(endpoint, "200").inc()
        finally:
            if len(done) < len(jobs):
                for job in jobs:
                    job.cancelled.set()  # the client went away or the server shuts down

    return app
