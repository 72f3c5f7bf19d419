"""Synchronous and asynchronous clients of the HTTP API.

Each endpoint is described once, as a `_Call` (method, path, body, how to read the answer);
the two clients only differ in how they send it. Turning a response into a result or an
`ApiError` happens in one function, `_read`, shared by both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Self, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from orchestrator.sdk._models import (
    Health,
    Job,
    JobCreated,
    JobPage,
    JobStatus,
    Slo,
    TemplateSaved,
    TokenCreated,
    TokenRevoked,
    WhoAmI,
    Workflow,
    WorkflowCancelled,
    WorkflowCreated,
    WorkflowDeleted,
    WorkflowPage,
    WorkflowTemplates,
)

__all__ = ["API_PREFIX", "ApiError", "AsyncClient", "Client", "normalise_base_url"]

API_PREFIX = "/api/v1"
USER_AGENT = "orchestrator-sdk/0.1"
REQUEST_ID_HEADER = "X-Request-ID"

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    """The service answered with an error (or with something that is not a valid answer).

    `code` is the service's snake_case error code (`unauthorized`, `not_found`, ...);
    `body` is the decoded JSON error body, or None when the body was not JSON (for example
    a proxy's own error page). Network failures are not ApiErrors: httpx raises those.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        request_id: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.request_id = request_id
        self.body = body

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status, self.code, self.message, self.request_id, self.body))

    def __str__(self) -> str:
        rid = f", request_id={self.request_id}" if self.request_id else ""
        return f"{self.status} {self.code}: {self.message}{rid}"

    def __repr__(self) -> str:
        return (
            f"ApiError(status={self.status}, code={self.code!r}, message={self.message!r}, "
            f"request_id={self.request_id!r})"
        )


def normalise_base_url(base_url: str) -> str:
    """`http://host:port`, with or without a trailing `/api/v1` (and slash) -> `.../api/v1`."""
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
    return url if url.endswith(API_PREFIX) else url + API_PREFIX


# --- reading answers ----------------------------------------------------------------------


def _json_object(response: httpx.Response) -> dict[str, Any] | None:
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _error_of(response: httpx.Response) -> ApiError:
    body = _json_object(response)
    header_id = response.headers.get(REQUEST_ID_HEADER)
    if body is not None and isinstance(body.get("error"), str):
        return ApiError(
            status=response.status_code,
            code=str(body.get("code") or f"http_{response.status_code}"),
            message=body["error"],
            request_id=body.get("request_id") or header_id,
            body=body,
        )
    text = response.text.strip()
    message = text[:200] if text else (response.reason_phrase or "error")
    return ApiError(response.status_code, f"http_{response.status_code}", message, header_id, body)


def _invalid(response: httpx.Response, why: str) -> ApiError:
    return ApiError(
        response.status_code,
        "invalid_response",
        why,
        response.headers.get(REQUEST_ID_HEADER),
        _json_object(response),
    )


def _model(cls: type[M]) -> Callable[[httpx.Response], M]:
    def parse(response: httpx.Response) -> M:
        body = _json_object(response)
        if body is None:
            raise _invalid(response, f"expected a JSON object for {cls.__name__}")
        try:
            return cls.model_validate(body)
        except ValidationError as exc:
            raise _invalid(response, f"response is not a valid {cls.__name__}: {exc}") from exc

    return parse


def _text(response: httpx.Response) -> str:
    return response.text


@dataclass(frozen=True)
class _Call(Generic[T]):
    """One request to make, and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    body: dict[str, Any] | None = None
    # Error statuses whose body is still a valid answer (a degraded /health is 503).
    answers: frozenset[int] = field(default_factory=frozenset)

    params: dict[str, Any] | None = None

    def build(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return http.build_request(self.method, self.path, json=self.body, params=self.params)


def _read(call: _Call[T], response: httpx.Response) -> T:
    if response.is_success:
        return call.parse(response)
    if response.status_code in call.answers:
        try:
            return call.parse(response)
        except ApiError:
            # Not the documented body (e.g. a proxy's own 503 page): report the error itself.
            pass
    raise _error_of(response)


# --- the endpoints, described once ---------------------------------------------------------


def _health() -> _Call[Health]:
    return _Call("GET", "/health", _model(Health), answers=frozenset({503}))


def _ready() -> _Call[str]:
    return _Call("GET", "/ready", _text)


def _metrics() -> _Call[str]:
    return _Call("GET", "/metrics", _text)


def _slo() -> _Call[Slo]:
    return _Call("GET", "/slo", _model(Slo))


def _whoami() -> _Call[WhoAmI]:
    return _Call("GET", "/whoami", _model(WhoAmI))


def _create_token(user_uuid: str, admin: bool, description: str) -> _Call[TokenCreated]:
    body = {"user_uuid": user_uuid, "admin": admin, "description": description}
    return _Call("POST", "/tokens", _model(TokenCreated), body=body)


def _revoke_token(prefix: str) -> _Call[TokenRevoked]:
    return _Call("DELETE", f"/tokens/{quote(prefix, safe='')}", _model(TokenRevoked))


def _create_workflow(
    name: str | None,
    steps: list[dict[str, Any]] | None,
    template: str | None,
    variables: dict[str, Any] | None,
    model: str | None,
) -> _Call[WorkflowCreated]:
    given = {"name": name, "steps": steps, "template": template, "variables": variables}
    body = {k: v for k, v in {**given, "model": model}.items() if v is not None}
    return _Call("POST", "/workflows", _model(WorkflowCreated), body=body)


def _workflow(workflow_id: str) -> _Call[Workflow]:
    return _Call("GET", f"/workflows/{quote(workflow_id, safe='')}", _model(Workflow))


def _workflows(
    status: str | None, parent: str | None, limit: int | None, offset: int
) -> _Call[WorkflowPage]:
    given = {"status": status, "parent": parent, "limit": limit, "offset": offset}
    params = {k: v for k, v in given.items() if v is not None}
    return _Call("GET", "/workflows", _model(WorkflowPage), params=params)


def _cancel_workflow(workflow_id: str) -> _Call[WorkflowCancelled]:
    path = f"/workflows/{quote(workflow_id, safe='')}/cancel"
    return _Call("POST", path, _model(WorkflowCancelled))


def _delete_workflow(workflow_id: str) -> _Call[WorkflowDeleted]:
    return _Call("DELETE", f"/workflows/{quote(workflow_id, safe='')}", _model(WorkflowDeleted))


def _save_template(name: str, steps: list[dict[str, Any]], shared: bool) -> _Call[TemplateSaved]:
    body = {"name": name, "steps": steps, "shared": shared}
    return _Call("POST", "/workflows/templates", _model(TemplateSaved), body=body)


def _templates() -> _Call[WorkflowTemplates]:
    return _Call("GET", "/workflows/templates", _model(WorkflowTemplates))


def _create_schedule(prompt: str, fields: dict[str, Any]) -> _Call[JobCreated]:
    body = {"prompt": prompt, **{k: v for k, v in fields.items() if v is not None}}
    return _Call("POST", "/schedules", _model(JobCreated), body=body)


def _schedules(page: int, per_page: int | None) -> _Call[JobPage]:
    params = {"page": page, **({"per_page": per_page} if per_page else {})}
    return _Call("GET", "/schedules", _model(JobPage), params=params)


def _schedule(job_id: int) -> _Call[Job]:
    return _Call("GET", f"/schedules/{int(job_id)}", _model(Job))


def _job_action(job_id: int, action: str) -> _Call[JobStatus]:
    if action == "delete":
        return _Call("DELETE", f"/schedules/{int(job_id)}", _model(JobStatus))
    return _Call("POST", f"/schedules/{int(job_id)}/{action}", _model(JobStatus))


def _client_options(base_url: str, token: str | None, timeout: float) -> dict[str, Any]:
    headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return {"base_url": normalise_base_url(base_url), "headers": headers, "timeout": timeout}


# --- the clients ---------------------------------------------------------------------------


class Client:
    """Blocking client. Use as a context manager, or call `close()`.

    `base_url` is the service address, with or without the `/api/v1` suffix; `token` is a
    bearer token (not needed for health, ready, metrics and slo).
    """

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        self._http = httpx.Client(**_client_options(base_url, token, timeout))

    @property
    def base_url(self) -> str:
        return str(self._http.base_url).rstrip("/")

    def _send(self, call: _Call[T]) -> T:
        return _read(call, self._http.send(call.build(self._http)))

    def health(self) -> Health:
        """Service health; returned (not raised) when degraded: check `.status`."""
        return self._send(_health())

    def ready(self) -> str:
        return self._send(_ready())

    def metrics(self) -> str:
        """Prometheus text exposition."""
        return self._send(_metrics())

    def slo(self) -> Slo:
        return self._send(_slo())

    def whoami(self) -> WhoAmI:
        return self._send(_whoami())

    def create_token(
        self, user_uuid: str, admin: bool = False, description: str = ""
    ) -> TokenCreated:
        """Issue a token for `user_uuid` (admin only)."""
        return self._send(_create_token(user_uuid, admin, description))

    def revoke_token(self, prefix: str) -> TokenRevoked:
        return self._send(_revoke_token(prefix))

    def create_workflow(
        self,
        name: str | None = None,
        steps: list[dict[str, Any]] | None = None,
        *,
        template: str | None = None,
        variables: dict[str, Any] | None = None,
        model: str | None = None,
    ) -> WorkflowCreated:
        """Inline (`name`, `steps`) or from a template; it starts at once."""
        return self._send(_create_workflow(name, steps, template, variables, model))

    def workflow(self, workflow_id: str) -> Workflow:
        return self._send(_workflow(workflow_id))

    def workflows(
        self,
        status: str | None = None,
        parent: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> WorkflowPage:
        return self._send(_workflows(status, parent, limit, offset))

    def cancel_workflow(self, workflow_id: str) -> WorkflowCancelled:
        return self._send(_cancel_workflow(workflow_id))

    def delete_workflow(self, workflow_id: str) -> WorkflowDeleted:
        return self._send(_delete_workflow(workflow_id))

    def save_template(
        self, name: str, steps: list[dict[str, Any]], shared: bool = False
    ) -> TemplateSaved:
        return self._send(_save_template(name, steps, shared))

    def templates(self) -> WorkflowTemplates:
        return self._send(_templates())

    def create_schedule(self, prompt: str, **fields: Any) -> JobCreated:
        """Admin. `fields`: name, and one of cron, every, at, schedule; model, opts, tz,
        delete_after_run."""
        return self._send(_create_schedule(prompt, fields))

    def schedules(self, page: int = 1, per_page: int | None = None) -> JobPage:
        return self._send(_schedules(page, per_page))

    def schedule(self, job_id: int) -> Job:
        return self._send(_schedule(job_id))

    def delete_schedule(self, job_id: int) -> JobStatus:
        return self._send(_job_action(job_id, "delete"))

    def pause_schedule(self, job_id: int) -> JobStatus:
        return self._send(_job_action(job_id, "pause"))

    def unpause_schedule(self, job_id: int) -> JobStatus:
        return self._send(_job_action(job_id, "unpause"))

    def run_schedule(self, job_id: int) -> JobStatus:
        return self._send(_job_action(job_id, "run"))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"


class AsyncClient:
    """Asynchronous client, same methods as `Client`. Use with `async with`, or `aclose()`."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        self._http = httpx.AsyncClient(**_client_options(base_url, token, timeout))

    @property
    def base_url(self) -> str:
        return str(self._http.base_url).rstrip("/")

    async def _send(self, call: _Call[T]) -> T:
        return _read(call, await self._http.send(call.build(self._http)))

    async def health(self) -> Health:
        """Service health; returned (not raised) when degraded: check `.status`."""
        return await self._send(_health())

    async def ready(self) -> str:
        return await self._send(_ready())

    async def metrics(self) -> str:
        """Prometheus text exposition."""
        return await self._send(_metrics())

    async def slo(self) -> Slo:
        return await self._send(_slo())

    async def whoami(self) -> WhoAmI:
        return await self._send(_whoami())

    async def create_token(
        self, user_uuid: str, admin: bool = False, description: str = ""
    ) -> TokenCreated:
        """Issue a token for `user_uuid` (admin only)."""
        return await self._send(_create_token(user_uuid, admin, description))

    async def revoke_token(self, prefix: str) -> TokenRevoked:
        return await self._send(_revoke_token(prefix))

    async def create_workflow(
        self,
        name: str | None = None,
        steps: list[dict[str, Any]] | None = None,
        *,
        template: str | None = None,
        variables: dict[str, Any] | None = None,
        model: str | None = None,
    ) -> WorkflowCreated:
        """Inline (`name`, `steps`) or from a template; it starts at once."""
        return await self._send(_create_workflow(name, steps, template, variables, model))

    async def workflow(self, workflow_id: str) -> Workflow:
        return await self._send(_workflow(workflow_id))

    async def workflows(
        self,
        status: str | None = None,
        parent: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> WorkflowPage:
        return await self._send(_workflows(status, parent, limit, offset))

    async def cancel_workflow(self, workflow_id: str) -> WorkflowCancelled:
        return await self._send(_cancel_workflow(workflow_id))

    async def delete_workflow(self, workflow_id: str) -> WorkflowDeleted:
        return await self._send(_delete_workflow(workflow_id))

    async def save_template(
        self, name: str, steps: list[dict[str, Any]], shared: bool = False
    ) -> TemplateSaved:
        return await self._send(_save_template(name, steps, shared))

    async def templates(self) -> WorkflowTemplates:
        return await self._send(_templates())

    async def create_schedule(self, prompt: str, **fields: Any) -> JobCreated:
        """Admin. `fields`: name, and one of cron, every, at, schedule; model, opts, tz,
        delete_after_run."""
        return await self._send(_create_schedule(prompt, fields))

    async def schedules(self, page: int = 1, per_page: int | None = None) -> JobPage:
        return await self._send(_schedules(page, per_page))

    async def schedule(self, job_id: int) -> Job:
        return await self._send(_schedule(job_id))

    async def delete_schedule(self, job_id: int) -> JobStatus:
        return await self._send(_job_action(job_id, "delete"))

    async def pause_schedule(self, job_id: int) -> JobStatus:
        return await self._send(_job_action(job_id, "pause"))

    async def unpause_schedule(self, job_id: int) -> JobStatus:
        return await self._send(_job_action(job_id, "unpause"))

    async def run_schedule(self, job_id: int) -> JobStatus:
        return await self._send(_job_action(job_id, "run"))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.base_url!r})"
