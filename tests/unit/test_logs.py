"""The JSON log formatter and the access line (no Ray, no network)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from orchestrator.config import Settings
from orchestrator.observability import (
    ACCESS_LOGGER,
    JsonFormatter,
    configure_process_logs,
    log_access,
    redact,
)

TOKEN = "orch_" + "A1b2C3d4" * 5


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_log_format_setting_defaults_to_text_and_takes_json() -> None:
    assert Settings().log_format == "text"
    assert Settings(log_format="json").log_format == "json"
    with pytest.raises(ValueError):
        Settings(log_format="xml")


def test_every_record_is_one_json_object_with_the_base_fields(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = captured
    logger.info("two\nlines %s", "here", extra={"workflow_id": "wf-1", "attempt": 2})
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    first, second = lines(out)  # a newline in a message stays inside its line
    assert first["level"] == "INFO" and first["logger"] == "tests.logs"
    assert first["message"] == "two\nlines here"
    assert first["workflow_id"] == "wf-1" and first["attempt"] == 2
    assert str(first["time"]).endswith("+00:00") and "T" in str(first["time"])
    assert second["level"] == "ERROR" and "ValueError: boom" in str(second["exc"])


def test_the_access_line_has_the_request_fields_and_wins_over_serve_context(
    captured: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, out = captured

    class ServeLikeContext(logging.Filter):
        # What Serve's context filter does on a replica's handler.
        def filter(self, record: logging.LogRecord) -> bool:
            record.route = "/"
            record.request_id = "serve-id"
            record.replica = "Api#abc"
            return True

    logger.handlers[0].addFilter(ServeLikeContext())
    log_access(
        request_id="serve-id",
        user="alice",
        method="GET",
        route="/api/v1/workflows/{workflow_id}",
        status=404,
        duration_ms=12.3456,
        logger=logger,
    )
    (line,) = lines(out)
    assert line["request_id"] == "serve-id" and line["user"] == "alice"
    assert line["method"] == "GET" and line["route"] == "/api/v1/workflows/{workflow_id}"
    assert line["status"] == 404 and line["duration_ms"] == 12.346
    assert line["replica"] == "Api#abc"  # Serve's own context is kept


def test_no_secret_reaches_a_line(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, out = captured
    logger.warning("header Authorization: Bearer %s", TOKEN)
    logger.warning("sent x-api-key: sk-live-123456 to https://h/v1?key=AIzaSecret&alt=sse")
    logger.warning("token %s revoked", TOKEN, extra={"detail": f"Bearer {TOKEN}"})
    text = out.getvalue()
    for secret in (TOKEN, "sk-live-123456", "AIzaSecret", "A1b2C3d4"):
        assert secret not in text
    assert "alt=sse" in text and "[redacted]" in text
    assert redact("nothing secret") == "nothing secret"


def test_configure_process_logs_replaces_root_handlers(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_process_logs("json", "INFO", stream=io.StringIO())
        (handler,) = root.handlers
        assert isinstance(handler.formatter, JsonFormatter)
        assert logging.getLogger("orchestrator").level == logging.INFO
        # Libraries speak at warnings only: httpx logs URLs (with keys) at INFO.
        assert root.level == logging.WARNING
        assert logging.getLogger(ACCESS_LOGGER).getEffectiveLevel() == logging.INFO
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
