"""Webhook verification tables: Slack signatures, Teams JWTs (against a JWKS served over
loopback HTTP by the Teams fake), Telegram source ranges and secret token."""

from __future__ import annotations

import json
import pickle
import time
from collections.abc import Callable, Iterator
from typing import Any

import jwt
import pytest

from orchestrator.channels import (
    TeamsVerifier,
    VerificationFailed,
    teams_channel_id,
    verify_slack,
    verify_teams_service_url,
    verify_telegram,
)
from orchestrator.channels._verify import parse_cidrs, slack_signature
from orchestrator.config import TELEGRAM_WEBHOOK_CIDRS
from orchestrator.errors import ServiceUnavailable, Unauthorized
from tests.conftest import free_port
from tests.fakes import slack_server
from tests.fakes.teams_server import SERVICE_URL, TeamsFake, rsa_key

# --- Slack -----------------------------------------------------------------------------------

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
NOW = 1_700_000_000
BODY = json.dumps(slack_server.message_event("hello agent")).encode()


def _signed(**changes: Any) -> dict[str, str]:
    headers = slack_server.sign(SECRET, BODY, NOW)
    for name, value in changes.items():
        key = name.replace("_", "-")
        if value is None:
            headers.pop(key)
        else:
            headers[key] = value
    return headers


SLACK_CASES: list[tuple[str, Callable[[], dict[str, str]], bytes, str | None]] = [
    ("valid", lambda: slack_server.sign(SECRET, BODY, NOW), BODY, None),
    (
        "valid, lower-case header names",
        lambda: {k.lower(): v for k, v in slack_server.sign(SECRET, BODY, NOW).items()},
        BODY,
        None,
    ),
    ("valid, 300 s old", lambda: slack_server.sign(SECRET, BODY, NOW - 300), BODY, None),
    ("valid, 300 s ahead", lambda: slack_server.sign(SECRET, BODY, NOW + 300), BODY, None),
    (
        "wrong secret",
        lambda: slack_server.sign("another-secret", BODY, NOW),
        BODY,
        "does not match",
    ),
    ("tampered body", lambda: slack_server.sign(SECRET, BODY, NOW), BODY + b" ", "does not match"),
    (
        "stale timestamp",
        lambda: slack_server.sign(SECRET, BODY, NOW - 301),
        BODY,
        "stale timestamp",
    ),
    ("timestamp in the future", lambda: slack_server.sign(SECRET, BODY, NOW + 301), BODY, "stale"),
    (
        "missing timestamp header",
        lambda: _signed(**{"X_Slack_Request_Timestamp": None}),
        BODY,
        "missing X-Slack-Request-Timestamp",
    ),
    (
        "missing signature header",
        lambda: _signed(**{"X_Slack_Signature": None}),
        BODY,
        "missing X-Slack-Signature",
    ),
    ("no headers at all", dict, BODY, "missing"),
    (
        "non-integer timestamp",
        lambda: _signed(**{"X_Slack_Request_Timestamp": "1700000000.5"}),
        BODY,
        "not an integer",
    ),
    ("empty timestamp", lambda: _signed(**{"X_Slack_Request_Timestamp": ""}), BODY, "integer"),
    (
        "signed timestamp with a sign",
        lambda: _signed(**{"X_Slack_Request_Timestamp": f"+{NOW}"}),
        BODY,
        "not an integer",
    ),
    (
        "bad prefix",
        lambda: _signed(X_Slack_Signature="v1=" + _signed()["X-Slack-Signature"][3:]),
        BODY,
        "unsupported signature version",
    ),
    (
        "no prefix",
        lambda: _signed(X_Slack_Signature=_signed()["X-Slack-Signature"][3:]),
        BODY,
        "version",
    ),
    ("garbage signature", lambda: _signed(X_Slack_Signature="v0=zz\u00e9"), BODY, "does not match"),
]


@pytest.mark.parametrize(
    ("make_headers", "body", "error"),
    [pytest.param(h, b, e, id=name) for name, h, b, e in SLACK_CASES],
)
def test_slack_signature(
    make_headers: Callable[[], dict[str, str]], body: bytes, error: str | None
) -> None:
    headers = make_headers()
    if error is None:
        verify_slack(SECRET, headers, body, now=NOW)
        return
    with pytest.raises(VerificationFailed) as caught:
        verify_slack(SECRET, headers, body, now=NOW)
    message = caught.value.message
    assert error in message
    assert message.startswith("slack signature: ")
    assert SECRET not in message
    signature = headers.get("X-Slack-Signature", "")
    assert not signature[3:] or signature[3:] not in message
    assert caught.value.status_code == 401


def test_slack_documented_example() -> None:
    """The worked example of Slack's "Verifying requests from Slack" guide."""
    body = (
        b"token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&"
        b"channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&"
        b"command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2F"
        b"commands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id="
        b"398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
    )
    expected = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
    assert slack_signature(SECRET, "1531420618", body) == expected
    headers = {"X-Slack-Request-Timestamp": "1531420618", "X-Slack-Signature": expected}
    verify_slack(SECRET, headers, body, now=1531420618 + 10)


def test_slack_uses_the_clock_and_tolerance() -> None:
    verify_slack(SECRET, slack_server.sign(SECRET, BODY), BODY)  # now = time.time()
    old = slack_server.sign(SECRET, BODY, int(time.time()) - 100)
    with pytest.raises(VerificationFailed, match="stale"):
        verify_slack(SECRET, old, BODY, tolerance_s=60)


def test_slack_refuses_an_empty_signing_secret() -> None:
    with pytest.raises(VerificationFailed, match="no signing secret"):
        verify_slack("", slack_server.sign("", BODY, NOW), BODY, now=NOW)


def test_verification_failed_is_a_clean_401() -> None:
    exc = VerificationFailed("slack signature: signature does not match the request body")
    assert isinstance(exc, Unauthorized)
    assert exc.status_code == 401
    assert exc.code == "unauthorized"
    assert exc.headers == {}  # no bearer challenge: the caller is a platform
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is VerificationFailed
    assert again.message == exc.message


# --- Teams -----------------------------------------------------------------------------------

APP_ID = "4f2b6c1e-5a7d-4e3b-9c8f-0a1b2c3d4e5f"


@pytest.fixture(scope="module")
def teams_server() -> Iterator[TeamsFake]:
    with TeamsFake(app_id=APP_ID) as fake:
        yield fake


@pytest.fixture
def teams(teams_server: TeamsFake) -> Iterator[TeamsFake]:
    yield teams_server
    teams_server.jwks_status = 200
    for kid in list(teams_server.keys):
        if kid != teams_server.kid:
            del teams_server.keys[kid]


def verifier(teams: TeamsFake, audience: str | None = APP_ID, **kw: Any) -> TeamsVerifier:
    return TeamsVerifier(teams.jwks_url, teams.issuer, audience, **kw)


def _bearer(token: str) -> str:
    return f"Bearer {token}"


TEAMS_CASES: list[tuple[str, Callable[[TeamsFake], str | None], str | None]] = [
    ("valid", lambda t: _bearer(t.mint()), None),
    ("valid, lower-case scheme", lambda t: f"bearer {t.mint()}", None),
    ("expired within the leeway", lambda t: _bearer(t.mint({"exp": int(time.time()) - 60})), None),
    ("wrong issuer", lambda t: _bearer(t.mint({"iss": "https://sts.example.com"})), "wrong issuer"),
    ("wrong audience", lambda t: _bearer(t.mint({"aud": "another-bot"})), "wrong audience"),
    ("no audience claim", lambda t: _bearer(t.mint({"aud": None})), "missing aud claim"),
    ("no issuer claim", lambda t: _bearer(t.mint({"iss": None})), "missing iss claim"),
    ("expired", lambda t: _bearer(t.mint({"exp": int(time.time()) - 3600})), "expired"),
    ("no expiry", lambda t: _bearer(t.mint({"exp": None})), "missing exp claim"),
    (
        "not yet valid",
        lambda t: _bearer(t.mint({"nbf": int(time.time()) + 3600})),
        "not yet valid",
    ),
    (
        "wrong key, same kid",
        lambda t: _bearer(t.mint(key=rsa_key())),
        "signature does not verify",
    ),
    (
        "unknown kid",
        lambda t: _bearer(t.mint(kid="rotated-away", key=rsa_key())),
        "unknown signing key",
    ),
    (
        "HS256 token",
        lambda t: _bearer(t.mint(algorithm="HS256", key="a-shared-secret-of-32-bytes-long!")),
        "algorithm HS256 not accepted",
    ),
    (
        "unsigned token (alg none)",
        lambda t: _bearer(jwt.encode({"iss": t.issuer, "aud": APP_ID}, None, algorithm="none")),
        "algorithm none not accepted",
    ),
    (
        "no kid",
        lambda t: _bearer(
            jwt.encode({"iss": t.issuer, "aud": APP_ID}, t.keys[t.kid], algorithm="RS256")
        ),
        "no key id",
    ),
    ("missing header", lambda t: None, "missing Authorization header"),
    ("empty header", lambda t: "", "missing Authorization header"),
    ("not Bearer", lambda t: f"Basic {t.mint()}", "not a Bearer token"),
    ("Bearer without a token", lambda t: "Bearer ", "empty Bearer token"),
    ("garbage", lambda t: "Bearer not-a-jwt", "malformed JWT"),
    ("three garbage parts", lambda t: "Bearer aaa.bbb.ccc", "malformed JWT"),
    (
        "tampered payload",
        lambda t: _bearer(_tamper(t.mint())),
        "signature does not verify",
    ),
]


def _tamper(token: str) -> str:
    """The same signature over a payload with a later expiry."""
    header, payload, signature = token.split(".")
    claims = json.loads(jwt.utils.base64url_decode(payload))
    claims["exp"] += 86400
    forged = jwt.utils.base64url_encode(json.dumps(claims).encode()).decode()
    return f"{header}.{forged}.{signature}"


@pytest.mark.parametrize(
    ("make_authorization", "error"),
    [pytest.param(m, e, id=name) for name, m, e in TEAMS_CASES],
)
async def test_teams_token(
    teams: TeamsFake, make_authorization: Callable[[TeamsFake], str | None], error: str | None
) -> None:
    authorization = make_authorization(teams)
    check = verifier(teams)
    if error is None:
        claims = await check.verify(authorization, "msteams")
        assert claims["aud"] == APP_ID
        assert claims["iss"] == "https://api.botframework.com"
        assert claims["serviceurl"] == SERVICE_URL
        return
    with pytest.raises(VerificationFailed) as caught:
        await check.verify(authorization, "msteams")
    message = caught.value.message
    assert error in message
    assert message.startswith("teams token: ")
    token = (authorization or "").partition(" ")[2]
    assert not token or token not in message


async def test_teams_without_audience_accepts_any_audience(teams: TeamsFake) -> None:
    check = verifier(teams, audience=None)
    claims = await check.verify(_bearer(teams.mint({"aud": "some-other-bot"})), "msteams")
    assert claims["aud"] == "some-other-bot"
    assert await check.verify(_bearer(teams.mint({"aud": None})), "msteams")
    with pytest.raises(VerificationFailed, match="wrong issuer"):
        await check.verify(_bearer(teams.mint({"iss": "https://evil.example"})), "msteams")


async def test_teams_leeway_is_configurable(teams: TeamsFake) -> None:
    token = _bearer(teams.mint({"exp": int(time.time()) - 60}))
    with pytest.raises(VerificationFailed, match="expired"):
        await verifier(teams, leeway_s=0).verify(token, "msteams")


async def test_teams_jwks_is_cached(teams: TeamsFake) -> None:
    check = verifier(teams)
    before = teams.jwks_fetches
    for _ in range(3):
        await check.verify(_bearer(teams.mint()), "msteams")
    assert teams.jwks_fetches == before + 1


async def test_teams_unknown_kid_refetches_the_jwks_once(teams: TeamsFake) -> None:
    check = verifier(teams, refetch_cooldown_s=0)
    await check.verify(_bearer(teams.mint()), "msteams")
    before = teams.jwks_fetches
    teams.keys["bf-key-2"] = rsa_key()  # the platform rotates its keys
    claims = await check.verify(_bearer(teams.mint(kid="bf-key-2")), "msteams")
    assert claims["aud"] == APP_ID
    assert teams.jwks_fetches == before + 1
    with pytest.raises(VerificationFailed, match="unknown signing key"):
        await check.verify(_bearer(teams.mint(kid="never-published", key=rsa_key())), "msteams")
    assert teams.jwks_fetches == before + 2


async def test_teams_unknown_kids_cannot_force_a_fetch_per_request(teams: TeamsFake) -> None:
    check = verifier(teams)  # the default cooldown
    await check.verify(_bearer(teams.mint()), "msteams")
    before = teams.jwks_fetches
    for n in range(3):
        with pytest.raises(VerificationFailed, match="unknown signing key"):
            await check.verify(_bearer(teams.mint(kid=f"forged-{n}", key=rsa_key())), "msteams")
    assert teams.jwks_fetches == before


async def test_teams_jwks_down_is_503(teams: TeamsFake) -> None:
    teams.jwks_status = 503
    with pytest.raises(ServiceUnavailable, match="could not be fetched") as caught:
        await verifier(teams).verify(_bearer(teams.mint()), "msteams")
    assert caught.value.status_code == 503


async def test_teams_jwks_unreachable_is_503(teams: TeamsFake) -> None:
    check = TeamsVerifier(
        f"http://127.0.0.1:{free_port()}/keys", teams.issuer, APP_ID, fetch_timeout_s=2
    )
    with pytest.raises(ServiceUnavailable, match="JWKS"):
        await check.verify(_bearer(teams.mint()), "msteams")


async def test_teams_cached_keys_survive_a_jwks_outage(teams: TeamsFake) -> None:
    check = verifier(teams)
    await check.verify(_bearer(teams.mint()), "msteams")
    teams.jwks_status = 500
    assert (await check.verify(_bearer(teams.mint()), "msteams"))["aud"] == APP_ID


async def test_teams_key_must_be_endorsed_for_the_activity_channel(teams: TeamsFake) -> None:
    """Bot Framework: the activity's channelId must be among the signing key's endorsements."""
    teams.keys["webchat-key"] = rsa_key()
    teams.endorsements["webchat-key"] = ["webchat"]
    teams.keys["bare-key"] = rsa_key()
    teams.endorsements["bare-key"] = None  # published without endorsements
    check = verifier(teams)
    assert (await check.verify(_bearer(teams.mint()), "skype"))["aud"] == APP_ID
    assert await check.verify(_bearer(teams.mint(kid="webchat-key")), "webchat")
    for kid, channel_id in (
        ("bf-key-1", "webchat"),
        ("webchat-key", "msteams"),
        ("bare-key", "msteams"),
        ("bf-key-1", "MSTEAMS"),
    ):
        with pytest.raises(VerificationFailed, match="not endorsed") as caught:
            await check.verify(_bearer(teams.mint(kid=kid)), channel_id)
        assert caught.value.status_code == 401
    with pytest.raises(VerificationFailed, match="no channelId"):
        await check.verify(_bearer(teams.mint()), None)
    # The signature comes first: a forged token is refused as such whatever the channel.
    with pytest.raises(VerificationFailed, match="signature does not verify"):
        await check.verify(_bearer(teams.mint(key=rsa_key())), None)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"type": "message", "channelId": "msteams"}', "msteams"),
        (b'{"type": "message"}', None),
        (b'{"channelId": 7}', None),
        (b'{"channelId": ""}', None),
        (b'["msteams"]', None),
        (b"not json", None),
        (b"\xff\xfe", None),
    ],
)
def test_teams_channel_id_of_a_body(raw: bytes, expected: str | None) -> None:
    assert teams_channel_id(raw) == expected


def test_teams_service_url_claim() -> None:
    claims = {"serviceurl": SERVICE_URL}
    verify_teams_service_url(claims, SERVICE_URL)
    verify_teams_service_url(claims, SERVICE_URL.rstrip("/"))
    verify_teams_service_url({}, "https://anything.example/")
    with pytest.raises(VerificationFailed, match="serviceurl"):
        verify_teams_service_url(claims, "https://evil.example/")
    with pytest.raises(VerificationFailed, match="serviceurl"):
        verify_teams_service_url(claims, None)


# --- Telegram --------------------------------------------------------------------------------

TELEGRAM_V6 = "2001:67c:4e8::/48"
CIDRS = [*TELEGRAM_WEBHOOK_CIDRS, TELEGRAM_V6]


@pytest.mark.parametrize(
    ("client_ip", "allowed"),
    [
        ("149.154.160.0", True),
        ("149.154.167.220", True),
        ("149.154.175.255", True),
        ("149.154.159.255", False),
        ("149.154.176.0", False),
        ("91.108.4.0", True),
        ("91.108.6.17", True),
        ("91.108.7.255", True),
        ("91.108.3.255", False),
        ("91.108.8.0", False),
        ("2001:67c:4e8:f004::9", True),
        ("2001:67c:4e9::1", False),
        ("::1", False),
        ("::ffff:149.154.167.220", True),
        ("::ffff:91.108.8.1", False),
        ("::ffff:127.0.0.1", False),
        ("127.0.0.1", False),
        ("10.0.0.5", False),
    ],
)
def test_telegram_source_ranges(client_ip: str, allowed: bool) -> None:
    if allowed:
        verify_telegram(client_ip, CIDRS, None, {})
    else:
        with pytest.raises(VerificationFailed, match="not in the allowed address ranges"):
            verify_telegram(client_ip, CIDRS, None, {})


@pytest.mark.parametrize(
    ("client_ip", "error"),
    [
        (None, "client address is unknown"),
        ("", "client address is unknown"),
        ("not-an-ip", "not an IP address"),
        ("149.154.167.999", "not an IP address"),
    ],
)
def test_telegram_needs_a_client_address(client_ip: str | None, error: str) -> None:
    with pytest.raises(VerificationFailed, match=error):
        verify_telegram(client_ip, CIDRS, None, {})


TG_SECRET = "s3cr3t-token_value"
INSIDE = "149.154.167.220"


@pytest.mark.parametrize(
    ("secret", "headers", "error"),
    [
        (TG_SECRET, {"x-telegram-bot-api-secret-token": TG_SECRET}, None),
        (TG_SECRET, {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET}, None),
        (TG_SECRET, {"x-telegram-bot-api-secret-token": "wrong"}, "does not match"),
        (TG_SECRET, {"x-telegram-bot-api-secret-token": ""}, "does not match"),
        (TG_SECRET, {"x-telegram-bot-api-secret-token": TG_SECRET + "x"}, "does not match"),
        (TG_SECRET, {"x-telegram-bot-api-secret-token": "t\u00f6ken"}, "does not match"),
        (TG_SECRET, {}, "missing X-Telegram-Bot-Api-Secret-Token"),
        (None, {}, None),
        (None, {"x-telegram-bot-api-secret-token": "anything"}, None),
    ],
    ids=[
        "right",
        "right, mixed-case header",
        "wrong",
        "empty",
        "longer",
        "non-ASCII",
        "missing",
        "not configured",
        "not configured, header sent",
    ],
)
def test_telegram_secret_token(
    secret: str | None, headers: dict[str, str], error: str | None
) -> None:
    if error is None:
        verify_telegram(INSIDE, CIDRS, secret, headers)
        return
    with pytest.raises(VerificationFailed, match=error) as caught:
        verify_telegram(INSIDE, CIDRS, secret, headers)
    assert TG_SECRET not in caught.value.message


def test_telegram_checks_the_address_before_the_secret() -> None:
    headers = {"x-telegram-bot-api-secret-token": TG_SECRET}
    with pytest.raises(VerificationFailed, match="not in the allowed"):
        verify_telegram("203.0.113.7", CIDRS, TG_SECRET, headers)


def test_telegram_empty_allowlist_admits_nobody() -> None:
    with pytest.raises(VerificationFailed, match="not in the allowed"):
        verify_telegram(INSIDE, [], None, {})
    verify_telegram(
        "203.0.113.7",
        ["0.0.0.0/0", "::/0"],
        TG_SECRET,
        {"x-telegram-bot-api-secret-token": TG_SECRET},
    )


def test_telegram_allowlist_must_be_cidrs() -> None:
    assert len(parse_cidrs(CIDRS)) == 3
    assert str(parse_cidrs(["10.1.2.3/8"])[0]) == "10.0.0.0/8"
    with pytest.raises(ValueError, match="not an IP range"):
        parse_cidrs(["149.154.160.0/20", "telegram"])
    with pytest.raises(ValueError, match="not an IP range"):
        verify_telegram(INSIDE, ["nonsense"], None, {})
