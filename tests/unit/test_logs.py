"""The JSON log formatter and the access line (no Ray, no network)."""

from __future__ import annotations

import builtins
import io
import json
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.config import Settings
from orchestrator.observability import (
    ACCESS_LOGGER,
    OUR_LOGGERS,
    JsonFormatter,
    configure_process_logs,
    flush_buffered_logs,
    log_access,
    redact,
)

with warnings.catch_warnings():  # Serve's own models still use pydantic v1 idioms
    warnings.simplefilter("ignore", DeprecationWarning)
    from ray.serve._private import logging_utils
    from ray.serve._private.common import ServeComponentType
    from ray.serve.schema import EncodingType, LoggingConfig

    from deployments.logs import SERVE_LOGGER, log_like_serve

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
    assert second["level"] == "ERROR" and "exc" not in second
    trace = second["exc_info"]
    assert isinstance(trace, str) and trace.startswith("Traceback (most recent call last):\n")
    assert trace.endswith("\nValueError: boom")


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
    logger.error("unhandled error POST /api/v1/channels/webhook/chw_Zq9-x_Y8w7V6u5T4s3R2")
    link = "iv-7.a.b3Bz.1795400000000.Zq9x_Y8w7V6u5T4s3R2Q1p0o9n8m7l6k"  # a decision link's
    logger.warning(
        "callback failed: https://orch.example.com/api/v1/channels/webhook/decide/%s", link
    )
    logger.info("intervention iv-7 approved")
    text = out.getvalue()
    secrets = (TOKEN, "sk-live-123456", "AIzaSecret", "A1b2C3d4", "chw_Zq9-x_Y8w7V6u5T4s3R2", link)
    for secret in secrets:
        assert secret not in text
    assert "Zq9x_Y8w7V6u5T4s3R2Q1p0o9n8m7l6k" not in text
    assert "alt=sse" in text and "[redacted]" in text
    assert "intervention iv-7 approved" in text  # an id is not a secret
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


def test_the_text_format_masks_secrets_in_messages_and_tracebacks() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    out = io.StringIO()
    try:
        configure_process_logs("text", "INFO", stream=out)
        try:
            raise RuntimeError(f"refused x-api-key: {TOKEN}")
        except RuntimeError:
            logging.getLogger("orchestrator.cli").exception("call with Bearer %s failed", TOKEN)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    first, *trace = out.getvalue().rstrip("\n").split("\n")
    assert TOKEN not in out.getvalue()
    assert first.endswith("ERROR orchestrator.cli: call with Bearer [redacted] failed")
    assert trace[0] == "Traceback (most recent call last):"
    assert trace[-1] == "RuntimeError: refused x-api-key: [redacted]"


@pytest.fixture
def replica_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """What a replica's process is like once Serve has configured it: throughput-optimized
    Serve (RAY_SERVE_LOG_TO_STDERR=0, as `orchestrator serve` runs it) redirects `print`,
    stdout and stderr to its logger. Everything it and log_like_serve change is put back."""
    monkeypatch.setattr(logging_utils, "RAY_SERVE_LOG_TO_STDERR", False)
    names = ["", SERVE_LOGGER, *OUR_LOGGERS, ACCESS_LOGGER]
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level) for n in names}
    propagate = {n: logging.getLogger(n).propagate for n in names}
    streams = (builtins.print, sys.stdout, sys.stderr)
    try:
        yield
    finally:
        builtins.print, sys.stdout, sys.stderr = streams
        for name, (handlers, level) in saved.items():
            logger = logging.getLogger(name)
            for handler in logger.handlers:
                if handler not in handlers:
                    target = getattr(handler, "target", None)  # Serve's file handler
                    handler.close()  # a MemoryHandler forgets its target here
                    if isinstance(target, logging.Handler):
                        target.close()
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate[name]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_replicas_traceback_is_one_readable_text(
    replica_logging: None, tmp_path: Path, log_format: str
) -> None:
    """Serve's own replica logger set up as on a replica, then ours: an error logged with
    its exception is one record whose traceback reads as Python prints it (Serve's
    replacement of `print` turned each line into a tuple repr), secrets masked."""
    encoding = EncodingType.JSON if log_format == "json" else EncodingType.TEXT
    logging_utils.configure_component_logger(
        component_name="orchestrator_Api",
        component_id="r1",
        logging_config=LoggingConfig(encoding=encoding, logs_dir=str(tmp_path)),
        component_type=ServeComponentType.REPLICA,
        max_bytes=1 << 20,
        backup_count=1,
    )
    assert builtins.print is logging_utils.redirected_print  # Serve's, as on a replica
    log_like_serve(Settings(log_format=log_format))
    try:
        raise RuntimeError(f"upstream said no to Bearer {TOKEN}")
    except RuntimeError as exc:
        logging.getLogger("orchestrator.http").error("unhandled error", exc_info=exc)
    print("printed on stdout")  # still Serve's: into the replica's log
    flush_buffered_logs()
    (path,) = tmp_path.glob("replica_*.log")
    text = path.read_text()
    assert TOKEN not in text and "[redacted]" in text
    assert "('" not in text, text
    if log_format == "json":
        entries = [json.loads(line) for line in text.splitlines()]
        (error,) = [e for e in entries if e["level"] == "ERROR"]
        trace = error["exc_info"]
        assert "printed on stdout\n" in [e["message"] for e in entries]
    else:
        assert "printed on stdout" in text
        trace = text[text.index("unhandled error") :].split("\n", 1)[1]
        trace = trace[: trace.index("\nINFO ")]
    lines = trace.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert re.fullmatch(r'  File ".*test_logs\.py", line \d+, in \w+', lines[1])
    assert lines[-1] == "RuntimeError: upstream said no to Bearer [redacted]"


def test_print_to_another_file_writes_what_print_writes(
    replica_logging: None, tmp_path: Path
) -> None:
    logging_utils.configure_component_logger(
        component_name="orchestrator_Api",
        component_id="r2",
        logging_config=LoggingConfig(logs_dir=str(tmp_path)),
        component_type=ServeComponentType.REPLICA,
        max_bytes=1 << 20,
        backup_count=1,
    )
    log_like_serve(Settings())
    out = io.StringIO()
    print("a", 1, None, file=out)
    print("b", "c", sep="-", end="", file=out, flush=True)
    print("d", sep=None, end=None, file=out)
    assert out.getvalue() == "a 1 None\nb-cd\n"
