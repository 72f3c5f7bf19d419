"""Signed one-time links that decide an intervention from a generic webhook (issue 32).

A webhook channel has no buttons of its own: its question carries, per listed approver, an
approve URL and a reject URL, `{public_url}/api/v1/channels/webhook/decide/{token}`. The token
names the intervention, the decision, the approver and an expiry, and is signed:

    iv-7.a.<approver, base64url>.<expiry, Unix s>.<HMAC-SHA256, base64url>

The HMAC key is derived from the service's secret box key (`channel_secret_key`, else
`<data_dir>/channel_key`), so every process of a deployment checks what any other signed,
and rotating the box key voids every link. A changed byte, another key: `LinkRefused`
(401); a genuine link past its expiry: `LinkExpired` (410, as DESIGN's "expired"); both
before anything is read. "One-time" is the store's: the first decision
wins, the link's second use is a 409 (the intervention is no longer pending).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import Gone, Unauthorized
from orchestrator.interventions._model import ID_PATTERN

if TYPE_CHECKING:
    from orchestrator.config import Settings

__all__ = ["DECIDE_PATH", "Link", "LinkExpired", "LinkRefused", "LinkSigner", "link_key"]

# Under the channels' public webhook prefix (deployments/layers/auth.py WEBHOOK_PREFIX).
DECIDE_PATH = "/api/v1/channels/webhook/decide/"
_PURPOSE = b"orchestrator intervention links v1"
_DECISIONS = {"a": True, "r": False}
MAX_TOKEN = 600


class LinkRefused(Unauthorized):
    """A link that is not ours, was changed, or expired: 401, nothing read or decided."""

    def __init__(self, message: str = "decision link refused", **kw: object) -> None:
        kw.setdefault("headers", {})  # the caller is a person's browser: no bearer challenge
        super().__init__(message, **kw)


class LinkExpired(Gone):
    """A link we signed, past its expiry: 410, nothing read or decided."""


@dataclass(frozen=True, slots=True)
class Link:
    """What a verified token says."""

    intervention_id: str
    approve: bool
    approver: str
    expires_at: int  # Unix s


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def link_key(settings: Settings) -> bytes:
    """The links' HMAC key, derived from the secret box key (created first if need be)."""
    from orchestrator.secret_box import KEY_FILE, configured_box

    configured = settings.channel_secret_key
    if configured is not None:
        material = configured.get_secret_value().encode()
    else:
        configured_box(settings)  # makes <data_dir>/channel_key on first use
        material = (Path(settings.data_dir) / KEY_FILE).read_bytes().strip()
    return hmac.new(material, _PURPOSE, hashlib.sha256).digest()


class LinkSigner:
    """Signs and checks decision tokens with one key (`link_key(settings)`)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())

    def token(self, intervention_id: str, approve: bool, approver: str, expires_at: int) -> str:
        body = (
            f"{intervention_id}.{'a' if approve else 'r'}.{_b64(approver.encode())}."
            f"{int(expires_at)}"
        )
        return f"{body}.{self._mac(body)}"

    def url(
        self, base: str, intervention_id: str, approve: bool, approver: str, expires_at: int
    ) -> str:
        token = self.token(intervention_id, approve, approver, expires_at)
        return base.rstrip("/") + DECIDE_PATH + token

    def verify(self, token: str, *, now: float | None = None) -> Link:
        """The link a token stands for; LinkRefused when it is malformed or not signed with
        this key, LinkExpired when it is past its expiry."""
        parts = token.split(".") if len(token) <= MAX_TOKEN else []
        if len(parts) != 5:
            raise LinkRefused("decision link: malformed")
        iv, decision, approver, expiry, mac = parts
        if not hmac.compare_digest(mac.encode(), self._mac(".".join(parts[:4])).encode()):
            raise LinkRefused("decision link: bad signature")
        if not ID_PATTERN.fullmatch(iv) or decision not in _DECISIONS or not expiry.isdigit():
            raise LinkRefused("decision link: malformed")
        if int(expiry) < (time.time() if now is None else now):
            raise LinkExpired("decision link: expired (the question was asked long ago)")
        try:
            who = _unb64(approver).decode()
        except ValueError:
            raise LinkRefused("decision link: malformed") from None
        return Link(iv, _DECISIONS[decision], who, int(expiry))
