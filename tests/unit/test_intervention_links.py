"""Signed decision links of a generic webhook's questions (issue 32): a token round-trips;
a changed byte, another key, an expired link or a malformed one is refused; the key is
derived from the secret box key (the same for every process of a deployment)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import Settings
from orchestrator.interventions import LinkExpired, LinkRefused, LinkSigner, link_key
from orchestrator.interventions._links import DECIDE_PATH

KEY = b"k" * 32
LATER = int(time.time()) + 3600


def test_round_trip() -> None:
    signer = LinkSigner(KEY)
    for approve in (True, False):
        for who in ("ops@example.com", "U0123", "名前.with.dots/and=signs"):
            link = signer.verify(signer.token("iv-42", approve, who, LATER))
            assert (link.intervention_id, link.approve, link.approver) == ("iv-42", approve, who)
            assert link.expires_at == LATER
    url = signer.url("https://orch.example.com/", "iv-1", True, "a", LATER)
    assert url.startswith("https://orch.example.com" + DECIDE_PATH + "iv-1.a.")


def test_tampered_other_key_expired_and_malformed_are_refused() -> None:
    signer = LinkSigner(KEY)
    token = signer.token("iv-42", True, "ops", LATER)
    iv, decision, who, expiry, mac = token.split(".")
    forged = [
        ".".join([iv, "r", who, expiry, mac]),  # reject with approve's signature
        ".".join(["iv-43", decision, who, expiry, mac]),
        ".".join([iv, decision, who, str(int(expiry) + 1), mac]),
        ".".join([iv, decision, who, expiry, mac[:-1] + ("A" if mac[-1] != "A" else "B")]),
        token + ".x",
        "x" * 700,
        "",
    ]
    for bad in forged:
        with pytest.raises(LinkRefused):
            signer.verify(bad)
    with pytest.raises(LinkRefused, match="bad signature"):
        LinkSigner(b"another key").verify(token)
    past = signer.token("iv-42", True, "ops", int(time.time()) - 1)
    with pytest.raises(LinkExpired, match="expired") as expired:
        signer.verify(past)
    assert expired.value.status_code == 410
    assert signer.verify(past, now=time.time() - 3600).approver == "ops"
    # A well-signed token that does not name an intervention is refused too.
    with pytest.raises(LinkRefused, match="malformed"):
        signer.verify(signer.token("wf-1", True, "ops", LATER))


def test_refusal_is_a_401_without_a_bearer_challenge() -> None:
    err = LinkRefused()
    assert err.status_code == 401 and "WWW-Authenticate" not in err.headers


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    return Settings(data_dir=tmp_path, **kw)


def test_key_follows_the_secret_box_key(tmp_path: Path) -> None:
    configured = link_key(_settings(tmp_path, channel_secret_key="s3cret"))
    assert configured == link_key(_settings(tmp_path / "other", channel_secret_key="s3cret"))
    assert configured != link_key(_settings(tmp_path, channel_secret_key="rotated"))
    from_file = link_key(_settings(tmp_path))  # <data_dir>/channel_key, made on first use
    assert (tmp_path / "channel_key").exists()
    assert from_file == link_key(_settings(tmp_path)) != configured
    assert from_file != link_key(_settings(tmp_path / "elsewhere"))
