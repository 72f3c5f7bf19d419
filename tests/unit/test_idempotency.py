"""The pure parts of idempotent creation (issue 32): what makes two requests the same one, the
key's bounds, and when the SDK may resend a keyed POST."""

from __future__ import annotations

import httpx
import pytest

from orchestrator.errors import ValidationFailed
from orchestrator.idempotency import check_key, fingerprint
from orchestrator.sdk import RetryPolicy
from orchestrator.sdk._base import Call, model_of
from orchestrator.wire import WorkflowCreated

PATH = "/api/v1/workflows"


def test_bodies_are_compared_by_their_canonical_json() -> None:
    a = fingerprint("POST", PATH, b'{"name": "n", "steps": [{"name": "a", "prompt": "p"}]}')
    b = fingerprint("post", PATH, b'{\n  "steps":[{"prompt":"p","name":"a"}],\n  "name":"n"}')
    assert a == b
    # Order inside a list matters; so do the values, the path and the method.
    assert a != fingerprint("POST", PATH, b'{"name": "n", "steps": [{"name": "b"}]}')
    assert a != fingerprint("POST", PATH, b'{"name": "m", "steps": [{"name": "a", "prompt": "p"}]}')
    other_path = "/api/v1/memory/default/store"
    assert a != fingerprint("POST", other_path, b'{"name":"n","steps":[{"name":"a","prompt":"p"}]}')
    assert fingerprint("POST", PATH, b"[1, 2]") != fingerprint("POST", PATH, b"[2, 1]")
    # Not JSON: its bytes (the routes refuse such a body before it is claimed anyway).
    assert fingerprint("POST", PATH, b"{x") != fingerprint("POST", PATH, b"{y")


@pytest.mark.parametrize("key", ["a", "k" * 255, "order-42/2026-11-28", " ~!\"#$%&'()*+,-./"])
def test_good_keys(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize("key", ["", "k" * 256, "café", "tab\there", "nul\x00", "del\x7f"])
def test_bad_keys_name_the_header(key: str) -> None:
    with pytest.raises(ValidationFailed) as bad:
        check_key(key)
    assert bad.value.status_code == 400
    assert bad.value.message.startswith("Idempotency-Key:")
    assert bad.value.extra["fields"][0]["field"] == "Idempotency-Key"


def _call(headers: dict[str, str] | None) -> Call[WorkflowCreated]:
    return Call("POST", "/workflows", model_of(WorkflowCreated), body={}, headers=headers)


def test_the_sdk_resends_a_post_only_with_a_key() -> None:
    policy = RetryPolicy()
    timeout = httpx.ReadTimeout("slow")
    assert not policy.should_retry_error("POST", timeout)
    assert policy.should_retry_error("POST", timeout, keyed=True)
    in_use = httpx.Response(
        409, json={"ok": False, "code": "idempotency_key_in_use"}, headers={"Retry-After": "1"}
    )
    reused = httpx.Response(409, json={"ok": False, "code": "idempotency_key_reused"})
    keyed, plain = _call({"Idempotency-Key": "k"}), _call(None)
    assert policy.should_retry_status(keyed, in_use)
    assert policy.delay(0, in_use) == 1.0
    assert not policy.should_retry_status(keyed, reused)
    assert not policy.should_retry_status(plain, in_use)
