"""One error hierarchy for the whole service.

Domain code raises these; `deployments/errors.py` is the one place that turns them into the
HTTP error body `{ok: false, error, code, request_id, ...extra}`. They pickle cleanly, so an
error raised inside a Ray actor arrives at the HTTP layer as the same class.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = [
    "ERROR_BY_STATUS",
    "BadGateway",
    "BadRequest",
    "Conflict",
    "ErrorCode",
    "Forbidden",
    "GatewayTimeout",
    "Gone",
    "InternalError",
    "MethodNotAllowed",
    "MisdirectedRequest",
    "NotFound",
    "OrchestratorError",
    "PayloadTooLarge",
    "RateLimited",
    "ServiceUnavailable",
    "Unauthorized",
    "Unprocessable",
    "ValidationFailed",
    "field_error",
    "field_items",
    "invalid_field",
]


class ErrorCode(StrEnum):
    BAD_REQUEST = "bad_request"
    VALIDATION_ERROR = "validation_error"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    GONE = "gone"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNPROCESSABLE = "unprocessable"
    RATE_LIMITED = "rate_limited"
    SERVICE_UNAVAILABLE = "service_unavailable"
    INTERNAL_ERROR = "internal_error"
    SEQ_CONFLICT = "seq_conflict"
    EVENT_REJECTED = "event_rejected"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    CIRCUIT_OPEN = "circuit_open"
    MODEL_NOT_FOUND = "model_not_found"
    UNSAFE_PATH = "unsafe_path"
    NO_MATCH = "no_match"
    MULTIPLE_MATCHES = "multiple_matches"
    MISDIRECTED = "misdirected_request"


class OrchestratorError(Exception):
    """Base of every error the service reports to a caller."""

    status_code: int = 500
    default_code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | str | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = str(code or self.default_code)
        self.extra = dict(extra or {})
        self.headers = dict(headers or {})

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments do not survive the default Exception pickling.
        return (_rebuild, (type(self), self.message, self.code, self.extra, self.headers))

    def body(self, request_id: str | None) -> dict[str, Any]:
        """The error body (DESIGN.md): the one place it is built, so `fields` always has one
        shape whatever form a producer passed (`field_items`)."""
        extra = dict(self.extra)
        if "fields" in extra or "field" in extra:
            extra["fields"] = field_items(extra.pop("fields", None), extra.pop("field", None))
        return {
            "ok": False,
            "error": self.message,
            "code": self.code,
            "request_id": request_id,
            **extra,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code={self.code!r})"


def field_error(field: Any, message: Any) -> dict[str, str]:
    """One item of a 400's `fields`: `{field, message}` (issue 33: one shape for all)."""
    return {"field": str(field), "message": str(message)}


def field_items(fields: Any, field: Any = None) -> list[dict[str, str]]:
    """`fields` in its one shape, a list of `{field, message}`. Takes the older forms a
    producer may still pass: a `{name: message}` dict, bare names, items whose text is
    under `error`, and a singular `field` name."""
    items: list[dict[str, str]] = []
    if isinstance(fields, dict):
        items = [field_error(k, v) for k, v in fields.items()]
    elif isinstance(fields, (list, tuple)):
        for item in fields:
            if isinstance(item, dict):
                name = item.get("field", "body")
                message = item.get("message", item.get("error", "invalid"))
                items.append(field_error(name, message))
            else:
                items.append(field_error(item, "invalid"))
    if field is not None and not any(i["field"] == str(field) for i in items):
        items.append(field_error(field, "invalid"))
    return items


def invalid_field(
    field: str,
    message: str,
    *,
    limit: str | None = None,
    cls: type[BadRequest] | None = None,
    **extra: Any,
) -> BadRequest:
    """A 400 naming one bad field: `"<field>: <message>"` with `fields: [{field, message}]`
    and, when the input went past a limit, `limit` naming its setting."""
    body: dict[str, Any] = {"fields": [field_error(field, message)], **extra}
    if limit is not None:
        body["limit"] = limit
    return (cls or ValidationFailed)(f"{field}: {message}", extra=body)


def _rebuild(
    cls: type[OrchestratorError],
    message: str,
    code: str,
    extra: dict[str, Any],
    headers: dict[str, str],
) -> OrchestratorError:
    return cls(message, code=code, extra=extra, headers=headers)


class BadRequest(OrchestratorError):
    status_code = 400
    default_code = ErrorCode.BAD_REQUEST


class ValidationFailed(BadRequest):
    """The request does not match its schema; `extra.fields` names each bad field."""

    default_code = ErrorCode.VALIDATION_ERROR


class Unauthorized(OrchestratorError):
    status_code = 401
    default_code = ErrorCode.UNAUTHORIZED

    def __init__(self, message: str = "missing or invalid bearer token", **kw: Any) -> None:
        kw.setdefault("headers", {"WWW-Authenticate": "Bearer"})
        super().__init__(message, **kw)


class Forbidden(OrchestratorError):
    status_code = 403
    default_code = ErrorCode.FORBIDDEN


class NotFound(OrchestratorError):
    status_code = 404
    default_code = ErrorCode.NOT_FOUND


class MethodNotAllowed(OrchestratorError):
    status_code = 405
    default_code = ErrorCode.METHOD_NOT_ALLOWED


class Conflict(OrchestratorError):
    status_code = 409
    default_code = ErrorCode.CONFLICT


class Gone(OrchestratorError):
    status_code = 410
    default_code = ErrorCode.GONE


class MisdirectedRequest(OrchestratorError):
    """A request that reached a replica without passing through its own service's proxy."""

    status_code = 421
    default_code = ErrorCode.MISDIRECTED


class PayloadTooLarge(OrchestratorError):
    status_code = 413
    default_code = ErrorCode.PAYLOAD_TOO_LARGE


class Unprocessable(OrchestratorError):
    status_code = 422
    default_code = ErrorCode.UNPROCESSABLE


class RateLimited(OrchestratorError):
    status_code = 429
    default_code = ErrorCode.RATE_LIMITED

    def __init__(
        self, message: str = "rate limit exceeded", *, retry_after: int = 1, **kw: Any
    ) -> None:
        headers = {"Retry-After": str(max(1, int(retry_after))), **kw.pop("headers", {})}
        extra = {"retry_after": max(1, int(retry_after)), **kw.pop("extra", {})}
        super().__init__(message, headers=headers, extra=extra, **kw)


class ServiceUnavailable(OrchestratorError):
    status_code = 503
    default_code = ErrorCode.SERVICE_UNAVAILABLE


class InternalError(OrchestratorError):
    status_code = 500
    default_code = ErrorCode.INTERNAL_ERROR


class BadGateway(OrchestratorError):
    """An upstream (a model provider) answered with an error we cannot pass through as is."""

    status_code = 502
    default_code = ErrorCode.UPSTREAM_ERROR


class GatewayTimeout(OrchestratorError):
    status_code = 504
    default_code = ErrorCode.UPSTREAM_TIMEOUT


ERROR_BY_STATUS: dict[int, type[OrchestratorError]] = {
    cls.status_code: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        NotFound,
        MethodNotAllowed,
        Conflict,
        Gone,
        PayloadTooLarge,
        Unprocessable,
        RateLimited,
        ServiceUnavailable,
        InternalError,
        BadGateway,
        GatewayTimeout,
    )
}
