"""The one place that turns errors into HTTP responses: `{ok:false, error, code, request_id}`."""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestrator.errors import (
    ERROR_BY_STATUS,
    BadRequest,
    ErrorCode,
    InternalError,
    OrchestratorError,
    ServiceUnavailable,
    ValidationFailed,
)

log = logging.getLogger("orchestrator.http")


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


# A dependency that is down (database, cache, an actor) is a 503, not a bug.
DEPENDENCY_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.CannotConnectNowError,
    RedisConnectionError,
    RedisTimeoutError,
    ConnectionError,
    TimeoutError,
)


def error_response(exc: OrchestratorError, request_id: str | None) -> JSONResponse:
    # X-Request-ID is added to every response by the request-context layer.
    if exc.status_code == 500:
        return internal_error_response(exc, request_id)
    return JSONResponse(exc.body(request_id), status_code=exc.status_code, headers=exc.headers)


def domain_error_response(exc: OrchestratorError, request_id: str | None) -> JSONResponse:
    """A domain error raised by a route or a request layer (deployments/layers): its own
    status and body; a dependency that is down is logged."""
    if exc.status_code == 503:
        log.warning("%s (request_id=%s): %s", exc.code, request_id, exc.message)
    return error_response(exc, request_id)


def internal_error_response(
    exc: BaseException, request_id: str | None, target: str = ""
) -> JSONResponse:
    """A 503 for a dependency that is down, else a 500; either way internals stay in the log
    and the caller gets the request id to quote."""
    if isinstance(exc, DEPENDENCY_ERRORS):
        log.warning("dependency unavailable (request_id=%s): %r", request_id, exc)
        err: OrchestratorError = ServiceUnavailable(
            "a dependency of the service is unavailable; retry shortly",
            headers={"Retry-After": "5"},
        )
        return JSONResponse(err.body(request_id), status_code=503, headers=err.headers)
    log.error("unhandled error (request_id=%s) %s", request_id, target, exc_info=exc)
    body = {
        "ok": False,
        "error": "internal server error",
        "code": ErrorCode.INTERNAL_ERROR,
        "request_id": request_id,
    }
    return JSONResponse(body, status_code=500)


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def validation_message(exc: RequestValidationError) -> tuple[str, list[dict[str, str]]]:
    fields = [
        {"field": _field(tuple(e.get("loc", ()))), "message": e.get("msg", "invalid")}
        for e in exc.errors()
    ]
    summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields) or "invalid request"
    return f"invalid request: {summary}", fields


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OrchestratorError)
    async def _domain(request: Request, exc: OrchestratorError) -> JSONResponse:
        if exc.status_code == 403:
            request.state.denied = exc.message  # recorded by deployments/layers/records.py
        return domain_error_response(exc, request_id_of(request))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, fields = validation_message(exc)
        return error_response(
            ValidationFailed(message, extra={"fields": fields}), request_id_of(request)
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, OrchestratorError):
            # Raised while FastAPI read the body (a body over max_request_bytes): ours.
            return error_response(exc.__cause__, request_id_of(request))
        cls = ERROR_BY_STATUS.get(
            exc.status_code, BadRequest if exc.status_code < 500 else InternalError
        )
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code in (404, 405):
            message = f"no route for {request.method} {request.url.path}"
        return error_response(cls(message, headers=dict(exc.headers or {})), request_id_of(request))

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        return internal_error_response(
            exc, request_id_of(request), f"{request.method} {request.url.path}"
        )
