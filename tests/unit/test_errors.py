import pickle

import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from starlette.testclient import TestClient

from deployments.errors import install_error_handlers
from orchestrator import errors as E


@pytest.mark.parametrize(
    "cls,status",
    [
        (E.BadRequest, 400),
        (E.Unauthorized, 401),
        (E.Forbidden, 403),
        (E.NotFound, 404),
        (E.Conflict, 409),
        (E.Gone, 410),
        (E.PayloadTooLarge, 413),
        (E.Unprocessable, 422),
        (E.RateLimited, 429),
        (E.ServiceUnavailable, 503),
        (E.InternalError, 500),
    ],
)
def test_status_and_pickling(cls: type[E.OrchestratorError], status: int) -> None:
    err = cls("boom", extra={"matches": 2}) if cls is not E.RateLimited else cls("boom")
    assert err.status_code == status
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is cls and again.message == "boom" and again.code == err.code
    assert again.extra == err.extra and again.headers == err.headers


def test_body_shape() -> None:
    body = E.BadRequest("multiple matches", extra={"matches": 3}).body("rid-1")
    assert body == {
        "ok": False,
        "error": "multiple matches",
        "code": "bad_request",
        "request_id": "rid-1",
        "matches": 3,
    }


def test_rate_limited_carries_retry_after() -> None:
    err = pickle.loads(pickle.dumps(E.RateLimited("slow down", retry_after=17)))
    assert err.headers["Retry-After"] == "17" and err.extra["retry_after"] == 17


class Item(BaseModel):
    name: str
    size: int


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/items")
    async def create(item: Item) -> dict:
        return {"ok": True}

    @app.get("/conflict")
    async def conflict() -> dict:
        raise E.Conflict("job is running", code="job_running")

    @app.get("/crash")
    async def crash() -> dict:
        raise RuntimeError("secret internals: password=hunter2")

    @app.get("/internal")
    async def internal() -> dict:
        raise E.InternalError("dsn postgresql://u:hunter2@db failed")

    @app.get("/db-down")
    async def db_down() -> dict:
        raise ConnectionRefusedError("connect to /tmp/pg/.s.PGSQL.5432 refused")

    return app


def test_mapping_through_a_real_app() -> None:
    client = TestClient(_app(), raise_server_exceptions=False)
    r = client.post("/items", json={"name": "x", "size": "big"})
    assert r.status_code == 400
    body = r.json()
    assert body["code"] == "validation_error" and "size" in body["error"]
    assert body["fields"][0]["field"] == "size"
    r = client.get("/conflict")
    assert r.status_code == 409 and r.json()["code"] == "job_running"
    r = client.get("/nowhere")
    assert r.status_code == 404 and r.json()["ok"] is False
    for path in ("/crash", "/internal"):
        r = client.get(path)
        assert r.status_code == 500
        assert "hunter2" not in r.text and r.json()["code"] == "internal_error"
        assert r.json()["error"] == "internal server error"
    r = client.get("/db-down")
    assert r.status_code == 503 and r.json()["code"] == "service_unavailable"
    assert "PGSQL" not in r.text and r.headers["retry-after"] == "5"
