"""An API route answered without FastAPI's dependency resolution when it has none to do.

The model endpoints (`POST /chat/completions`, `/messages`) are on every model call's path,
and FastAPI's per-request work for a route (reading and validating the body, resolving the
dependencies, however few) was a third of such a call's CPU (docs/benchmarks.md, "Hot
paths"). A `JsonRoute` is an ordinary `APIRoute`: routed, documented in the OpenAPI
document, inside the app's middlewares and exception handlers like every other route. What
differs is only how its endpoint is called when FastAPI would do nothing but parse the body:

- the endpoint takes exactly a JSON object body (`Annotated[dict[str, Any], Body()]`) and
  optionally the `Request`, and no dependency applies to the route (none of its own, its
  router's or the app's): a request with `Content-Type: application/json` whose body is a
  JSON object is handed to the endpoint directly, from the route's own ASGI app (the
  endpoint's exceptions reach the app's exception handlers around the routes, as with
  FastAPI's handler);
- anything else, a route with a dependency (one added later, to the route or the whole app,
  included) or a request with another body, is FastAPI's own handler, so its dependencies
  run and its errors are FastAPI's.

The endpoint reaches the context and the caller through the same functions the dependencies
call (deployments/deps.py). Add a JsonRoute to the app's router (`route_class_override`),
not through `include_router`: an include's dependencies are applied outside the route
object, where this route cannot see them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, get_args, get_origin

from fastapi import params
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from deployments.asgi_body import read_body, replay
from orchestrator._json import loads


def _json_object_body(annotation: Any) -> bool:
    """`Annotated[dict[...], Body()]`, not embedded."""
    if get_origin(annotation) is not Annotated:
        return False
    kind, *metadata = get_args(annotation)
    body = [m for m in metadata if isinstance(m, params.Body)]
    return (kind is dict or get_origin(kind) is dict) and len(body) == 1 and not bool(body[0].embed)


def _is_json(scope: Scope) -> bool:
    for key, value in scope["headers"]:
        if key == b"content-type":
            return bool(value.split(b";", 1)[0].strip().lower() == b"application/json")
    return False


class JsonRoute(APIRoute):
    """See the module's docstring."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **options: Any) -> None:
        super().__init__(path, endpoint, **options)
        direct = self._direct_parameters()
        if direct is not None:
            self._body_name, self._request_name = direct
            # FastAPI's app for this route (its handler in `request_response`): what a
            # request the endpoint is not called directly for gets.
            self._fastapi_app = self.app
            self.app = self._direct

    def _direct_parameters(self) -> tuple[str, str | None] | None:
        """(the body's parameter, the request's or None) when FastAPI would only parse the
        body for this endpoint; None when it has more to do."""
        if (
            self.dependencies
            or self.max_body_size is not None
            or not inspect.iscoroutinefunction(self.endpoint)
        ):
            return None
        body = request = None
        signature = inspect.signature(self.endpoint, eval_str=True)
        for name, parameter in signature.parameters.items():
            if parameter.annotation is Request or (
                isinstance(parameter.annotation, type) and issubclass(parameter.annotation, Request)
            ):
                request = name
            elif body is None and _json_object_body(parameter.annotation):
                body = name
            else:
                return None
        return (body, request) if body is not None else None

    async def _direct(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The endpoint called with the JSON object body (and the request); its exceptions
        go to the app's exception handlers, around the routes, as FastAPI's would."""
        if _is_json(scope):
            body = await read_body(receive)
            try:
                data = loads(body)
            except (ValueError, RecursionError):
                data = None
            if isinstance(data, dict):
                arguments: dict[str, Any] = {self._body_name: data}
                if self._request_name is not None:
                    # Its body still readable (`await request.body()`), as FastAPI's is.
                    arguments[self._request_name] = Request(scope, replay(body, receive), send)
                response = await self.endpoint(**arguments)
                if not isinstance(response, Response):
                    raise TypeError(f"{self.path}: a JsonRoute's endpoint answers a Response")
                await response(scope, receive, send)
                return
            receive = replay(body, receive)
        await self._fastapi_app(scope, receive, send)


__all__ = ["JsonRoute"]
