"""JsonRoute (deployments/json_route.py): an API route whose endpoint is called directly when
FastAPI would only parse its JSON object body, and FastAPI's own handler otherwise, so that
whatever FastAPI applies to routes (dependencies of the app or the route, exception handlers,
the OpenAPI document, its validation answers) applies to it as to every route. The model
endpoints on the real app: tests/integration/test_gateway.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from starlette.testclient import TestClient

from deployments.json_route import JsonRoute
from deployments.routers import responses
from deployments.routers.gateway import MODEL_ENDPOINTS

JsonBody = Annotated[dict[str, Any], Body()]
JSON = {"content-type": "application/json"}


class Refused(Exception):
    pass


async def echo(body: JsonBody, request: Request) -> Response:
    if body.get("refuse"):
        raise Refused(body["refuse"])
    raw = await request.body()  # still readable, as under FastAPI's handler
    return JSONResponse({"body": body, "path": request.url.path, "bytes": len(raw)})


def _app(**fastapi: Any) -> tuple[FastAPI, JsonRoute]:
    app = FastAPI(**fastapi)
    app.router.add_api_route("/echo", echo, methods=["POST"], route_class_override=JsonRoute)
    route = app.router.routes[-1]
    assert isinstance(route, JsonRoute)
    return app, route


def test_a_json_object_body_reaches_the_endpoint_directly() -> None:
    app, route = _app()
    assert route._direct_parameters() == ("body", "request")
    with TestClient(app) as client:
        r = client.post("/echo", content=b'{"a": [1, {"b": null}]}', headers=JSON)
    assert r.status_code == 200
    assert r.json() == {"body": {"a": [1, {"b": None}]}, "path": "/echo", "bytes": 23}


def test_any_other_body_gets_fastapis_own_answer() -> None:
    app, _ = _app()
    with TestClient(app) as client:
        for content, content_type in (
            (b"[1, 2]", "application/json"),
            (b"{not json", "application/json"),
            (b"", "application/json"),
            (b'{"a": 1}', "text/plain"),
        ):
            r = client.post("/echo", content=content, headers={"content-type": content_type})
            assert r.status_code == 422, (content, content_type, r.text)
        # A JSON media type other than application/json: FastAPI parses it, as before.
        r = client.post(
            "/echo", content=b'{"a": 1}', headers={"content-type": "application/merge+json"}
        )
        assert r.status_code == 200 and r.json()["body"] == {"a": 1}


def test_a_dependency_of_the_app_applies_to_the_route() -> None:
    """What issue 31 is about: something added on the FastAPI side reaches the route."""
    seen: list[str] = []

    async def gate(request: Request) -> None:
        seen.append(request.url.path)
        if request.headers.get("x-key") != "open":
            raise HTTPException(403, "closed")

    app, route = _app(dependencies=[Depends(gate)])
    assert route._direct_parameters() is None  # FastAPI's handler: it runs the dependency
    with TestClient(app) as client:
        assert client.post("/echo", json={"a": 1}).status_code == 403
        r = client.post("/echo", json={"a": 1}, headers={"x-key": "open"})
    assert r.status_code == 200 and r.json()["body"] == {"a": 1}
    assert seen == ["/echo", "/echo"]


def test_an_exception_handler_of_the_app_applies_to_the_route() -> None:
    app, _ = _app()

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"refused": str(exc)}, status_code=409)

    with TestClient(app) as client:
        r = client.post("/echo", json={"refuse": "no"})
    assert r.status_code == 409 and r.json() == {"refused": "no"}


def test_an_endpoint_with_anything_to_resolve_is_fastapis() -> None:
    async def with_query(body: JsonBody, limit: int = 3) -> Response:
        return JSONResponse({"limit": limit})

    async def with_dependency(
        body: JsonBody, request: Annotated[str, Depends(lambda: "x")]
    ) -> Response:
        return JSONResponse({})

    app = FastAPI()
    for path, endpoint in (("/q", with_query), ("/d", with_dependency)):
        app.router.add_api_route(path, endpoint, methods=["POST"], route_class_override=JsonRoute)
    routes = [r for r in app.router.routes if isinstance(r, JsonRoute)]
    assert [r._direct_parameters() for r in routes] == [None, None]
    with TestClient(app) as client:
        assert client.post("/q?limit=7", json={}).json() == {"limit": 7}


def test_the_model_endpoints_are_called_directly() -> None:
    """Their signature is the direct one: a change that gave them a dependency would make
    every model call resolve it (docs/benchmarks.md): that is a choice, not an accident."""
    app = FastAPI()
    for path, endpoint in MODEL_ENDPOINTS + responses.MODEL_ENDPOINTS:
        app.router.add_api_route(path, endpoint, methods=["POST"], route_class_override=JsonRoute)
    routes = [r for r in app.router.routes if isinstance(r, JsonRoute)]
    assert [r._direct_parameters() for r in routes] == [("body", "request")] * len(routes)
