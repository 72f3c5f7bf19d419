"""A real loopback HTTP server that plays Microsoft Teams / Bot Framework for channel tests.

    with TeamsFake(app_id="app-id") as teams:           # or `async with`
        verifier = TeamsVerifier(teams.jwks_url, teams.issuer, "app-id")
        token = teams.mint()                            # an RS256 JWT like Bot Framework's
        ...  # send_teams(..., config={"webhook_url": teams.webhook_url})
        teams.posted[-1]                                # the JSON bodies accepted, in order

Routes:
- `GET /.well-known/keys` (`jwks_url`): the JWKS, `{"keys": [{kty, use, kid, x5t, n, e,
  endorsements}]}` of the public halves of `keys` (kid -> RSA private key); each key's
  `endorsements` (the channels it signs for) are `endorsements[kid]`, by default
  `["msteams", "skype"]` as Microsoft publishes them; None leaves the field out. `jwks_status`
  other than 200 answers that status; `jwks_fetches` counts the requests.
- `POST /webhookb2/<group>@<tenant>/IncomingWebhook/<id>/<owner>` (`webhook_url`, an Office 365
  connector): `200 1` as text; a body without `text` (or `sections`/`attachments`) gets
  `400 Summary or Text is required.`
- `POST /workflows/<id>/triggers/manual/paths/invoke` (`workflow_url`, a Power Automate
  "Workflows" webhook): `202` with an empty body; a body that is not a message with an
  Adaptive Card attachment gets `400`.

Failures: `fail_next(n, status, retry_after=)` makes the next n webhook posts answer `status`
(429 with `Retry-After`); `status=200` with `error="429"` plays the connector's way of
refusing with a 200: `Webhook message delivery failed with error: Microsoft Teams endpoint
returned HTTP error 429 ...`.

`mint(claims, kid=, key=, algorithm=)` signs a token with Bot Framework's claims (iss, aud =
app id, serviceurl, nbf, exp) merged with `claims` (a None value removes a claim);
`message_activity(text, ...)` builds a Bot Framework message Activity as Teams sends it.

The bot's side of the Bot Connector (issue 32; learn.microsoft.com
bot-framework-rest-connector-authentication and -api-reference):
- `POST /botframework.com/oauth2/v2.0/token` (`login_url` is the base): form
  `grant_type=client_credentials&client_id=<app id>&client_secret=<app_password>&scope=
  https://api.botframework.com/.default` -> `{"token_type": "Bearer", "expires_in": 3599,
  "ext_expires_in": 3599, "access_token"}`; a wrong client or secret `401 {"error":
  "invalid_client", ...}`. `tokens_issued` counts them.
- `POST /v3/conversations/<id>/activities` and `PUT .../activities/<activityId>` (`url` is the
  `service_url`): only with `Authorization: Bearer <a token it issued>` (else `401
  {"message": "Authorization has been denied for this request."}`); a POST answers `201
  {"id"}` and records the activity in `activities`, a PUT of an activity it holds answers
  `200 {"id"}` and records it in `updates` (unknown: `404`).
- `submit_activity(data)` is the `message` activity an `Action.Submit` sends (`value` = the
  action's data); `invoke_activity(data)` the Universal Actions `invoke`
  (`name: adaptiveCard/action`).
"""

from __future__ import annotations

import itertools
import secrets
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, unquote

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fakes._channel_fake import ChannelFake
from tests.fakes._loopback import RecordedRequest, Send

__all__ = [
    "BOT_ID",
    "ENDORSEMENTS",
    "ISSUER",
    "SERVICE_URL",
    "TENANT",
    "TeamsFake",
    "invoke_activity",
    "message_activity",
    "rsa_key",
    "submit_activity",
]

ISSUER = "https://api.botframework.com"
SERVICE_URL = "https://smba.trafficmanager.net/amer/"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
BOT_ID = "28:c9e8c047-2a74-40a2-b28a-b162d5f5327c"
USER_ID = "29:1XJKJMvc5GBtc2JwZq0oj8tHZmzrQgFmB25ATiQWA85gQtHieVkKilBZ9XHoq9j7Zaqt7CZ"
WEBHOOK_PATH = (
    f"/webhookb2/2c5f1b3e-8f6d-4a57-9b1e-3f0c6a7d8e9f@{TENANT}"
    "/IncomingWebhook/9d8c7b6a5f4e3d2c1b0a/6e5d4c3b-2a19-4807-b6c5-d4e3f2a1b0c9"
)
WORKFLOW_PATH = "/workflows/0a1b2c3d4e5f60718293a4b5c6d7e8f9/triggers/manual/paths/invoke"
ENDORSEMENTS = ["msteams", "skype"]
_activities = itertools.count(1508439884810)


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _public_jwk(kid: str, key: rsa.RSAPrivateKey, endorsements: list[str] | None) -> Any:
    jwk = jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    out = {"kty": "RSA", "use": "sig", "kid": kid, "x5t": kid, "n": jwk["n"], "e": jwk["e"]}
    if endorsements is not None:
        out["endorsements"] = endorsements
    return out


def message_activity(
    text: str,
    *,
    activity_id: str | None = None,
    conversation_id: str = "a:17I0kl9EkpE1O9PH5TWrzrLNwnWWcfrU7QZjKR0WSfOpzbfcAg2IaydGElSo10tVr4",
    service_url: str = SERVICE_URL,
    user_name: str = "Megan Bowen",
    mention_bot: bool = False,
    tenant: str = TENANT,
) -> Any:
    """A message Activity as Teams posts it to a bot (personal chat, or a channel mention)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    entities: list[dict[str, Any]] = [
        {
            "locale": "en-US",
            "country": "US",
            "platform": "Windows",
            "timezone": "America/Los_Angeles",
            "type": "clientInfo",
        }
    ]
    if mention_bot:
        at = "<at>Teams TestBot</at>"
        text = f"{at} {text}"
        entities.append(
            {"type": "mention", "mentioned": {"id": BOT_ID, "name": "Teams TestBot"}, "text": at}
        )
    return {
        "text": text,
        "textFormat": "plain",
        "type": "message",
        "timestamp": now,
        "localTimestamp": now,
        "id": activity_id or str(next(_activities)),
        "channelId": "msteams",
        "serviceUrl": service_url,
        "from": {
            "id": USER_ID,
            "name": user_name,
            "aadObjectId": "6b4ff4f4-6a8d-4f39-9f5e-2bb2b7a8c1d0",
        },
        "conversation": {
            "conversationType": "channel" if mention_bot else "personal",
            "tenantId": tenant,
            "id": conversation_id,
        },
        "recipient": {"id": BOT_ID, "name": "Teams TestBot"},
        "entities": entities,
        "channelData": {"tenant": {"id": tenant}},
        "locale": "en-US",
    }


AAD_USER = "6b4ff4f4-6a8d-4f39-9f5e-2bb2b7a8c1d0"


def _card_activity(kind: str, value: Any, activity_id: str | None, aad: str | None) -> Any:
    base = message_activity("", activity_id=activity_id)
    base.pop("text", None)
    base.pop("textFormat", None)
    base["type"] = kind
    base["from"] = {"id": USER_ID, "name": "Megan Bowen"}
    if aad is not None:
        base["from"]["aadObjectId"] = aad
    base["replyToId"] = "1:1nQ9d5YcOa2-7XbD7uLkZg"
    base["value"] = value
    return base


def submit_activity(
    data: Any, *, activity_id: str | None = None, aad_object_id: str | None = AAD_USER
) -> Any:
    """The `message` activity an Adaptive Card `Action.Submit` posts: no text, `value` is the
    action's `data`."""
    return _card_activity("message", data, activity_id, aad_object_id)


def invoke_activity(
    data: Any, *, activity_id: str | None = None, aad_object_id: str | None = AAD_USER
) -> Any:
    """A Universal Actions `invoke` (`adaptiveCard/action`) carrying `data`."""
    activity = _card_activity(
        "invoke",
        {"action": {"type": "Action.Execute", "verb": "decide", "data": data}, "trigger": "manual"},
        activity_id,
        aad_object_id,
    )
    activity["name"] = "adaptiveCard/action"
    return activity


class TeamsFake(ChannelFake):
    label = "Teams"

    def __init__(
        self,
        *,
        app_id: str = "4f2b6c1e-5a7d-4e3b-9c8f-0a1b2c3d4e5f",
        app_password: str = "bot~Pa55w0rd.secret",
        kid: str = "bf-key-1",
        key: rsa.RSAPrivateKey | None = None,
    ) -> None:
        super().__init__()
        self.app_id = app_id
        self.issuer = ISSUER
        self.kid = kid
        self.keys: dict[str, rsa.RSAPrivateKey] = {kid: key or rsa_key()}
        self.endorsements: dict[str, list[str] | None] = {}  # kid -> published endorsements
        self.jwks_status = 200
        self.jwks_fetches = 0
        self.jwks_url = f"{self.url}/.well-known/keys"
        self.webhook_url = f"{self.url}{WEBHOOK_PATH}"
        self.workflow_url = f"{self.url}{WORKFLOW_PATH}?api-version=2016-06-01&sp=%2Ftriggers"
        self.posted: list[dict[str, Any]] = []
        self.app_password = app_password
        self.login_url = self.url
        self.tokens_issued = 0
        self._tokens: set[str] = set()
        self.activities: list[tuple[str, dict[str, Any]]] = []  # (conversation id, activity)
        self.updates: list[tuple[str, str, dict[str, Any]]] = []  # (conversation, id, activity)
        self._activity_ids: set[tuple[str, str]] = set()

    def reset(self) -> None:
        super().reset()
        self.posted.clear()
        self.activities.clear()
        self.updates.clear()

    def jwks(self) -> dict[str, Any]:
        return {
            "keys": [
                _public_jwk(kid, key, self.endorsements.get(kid, ENDORSEMENTS))
                for kid, key in self.keys.items()
            ]
        }

    def mint(
        self,
        claims: dict[str, Any] | None = None,
        *,
        kid: str | None = None,
        key: Any = None,
        algorithm: str = "RS256",
        lifetime_s: int = 3600,
    ) -> str:
        """A Bot Framework style JWT, signed by `key` (default: the published key of `kid`)."""
        now = int(time.time())
        body: dict[str, Any] = {
            "serviceurl": SERVICE_URL,
            "nbf": now - 5,
            "exp": now + lifetime_s,
            "iss": self.issuer,
            "aud": self.app_id,
        }
        for name, value in (claims or {}).items():
            if value is None:
                body.pop(name, None)
            else:
                body[name] = value
        kid = kid or self.kid
        signing = key if key is not None else self.keys[kid]
        headers = {"kid": kid, "x5t": kid, "typ": "JWT"}
        return jwt.encode(body, signing, algorithm=algorithm, headers=headers)

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        if request.method == "GET" and request.path == "/.well-known/keys":
            self.jwks_fetches += 1
            if self.jwks_status != 200:
                await self.send_body(send, self.jwks_status, b"Service Unavailable", [])
            else:
                await self.send_json(send, 200, self.jwks())
        elif request.method == "POST" and request.path.startswith("/webhookb2/"):
            await self._connector(request, send)
        elif request.method == "POST" and request.path == WORKFLOW_PATH:
            await self._workflow(request, send)
        elif request.method == "POST" and request.path == "/botframework.com/oauth2/v2.0/token":
            await self._token(request, send)
        elif request.path.startswith("/v3/conversations/"):
            await self._connector_api(request, send)
        else:
            await self.send_body(send, 404, b"Not Found", [("content-type", "text/plain")])

    async def _text(self, send: Send, status: int, text: str, headers: Any = ()) -> None:
        await self.send_body(
            send, status, text.encode(), [("content-type", "text/plain; charset=utf-8"), *headers]
        )

    async def _failed(self, send: Send) -> bool:
        failure = await self.next_failure()
        if failure is None:
            return False
        if failure.status == 200:
            refused = failure.error or "429"
            await self._text(
                send,
                200,
                "Webhook message delivery failed with error: Microsoft Teams endpoint returned "
                f"HTTP error {refused} with ContextId tcid=0,server=msgapi-production-eus-azsc2-4"
                ",cv=deadbeef=2.",
            )
            return True
        headers = [] if failure.retry_after is None else [("retry-after", str(failure.retry_after))]
        await self._text(send, failure.status, failure.error or "Internal Server Error", headers)
        return True

    async def _connector(self, request: RecordedRequest, send: Send) -> None:
        if await self._failed(send):
            return
        if request.path != WEBHOOK_PATH:
            await self._text(send, 404, "Webhook not found")
            return
        try:
            body = request.json
        except ValueError:
            body = None
        if not isinstance(body, dict) or not (
            body.get("text") or body.get("sections") or body.get("attachments")
        ):
            await self._text(send, 400, "Summary or Text is required.")
            return
        self.posted.append(body)
        await self._text(send, 200, "1")

    async def _token(self, request: RecordedRequest, send: Send) -> None:
        form = dict(parse_qsl(request.raw.decode()))
        if form.get("grant_type") != "client_credentials":
            await self.send_json(send, 400, {"error": "unsupported_grant_type"})
            return
        if (
            form.get("client_id") != self.app_id
            or form.get("client_secret") != self.app_password
            or form.get("scope") != "https://api.botframework.com/.default"
        ):
            await self.send_json(
                send,
                401,
                {
                    "error": "invalid_client",
                    "error_description": "AADSTS7000215: Invalid client secret provided.",
                    "error_codes": [7000215],
                },
            )
            return
        token = "eyJ0eXAiOiJKV1Qi." + secrets.token_urlsafe(24)
        self._tokens.add(token)
        self.tokens_issued += 1
        await self.send_json(
            send,
            200,
            {
                "token_type": "Bearer",
                "expires_in": 3599,
                "ext_expires_in": 3599,
                "access_token": token,
            },
        )

    async def _connector_api(self, request: RecordedRequest, send: Send) -> None:
        # /v3/conversations/{conversationId}/activities[/{activityId}], ids percent-encoded.
        parts = request.raw_path.split("?")[0].split("/")
        bearer = request.headers.get("authorization", "")
        if not bearer.startswith("Bearer ") or bearer[7:] not in self._tokens:
            await self.send_json(
                send, 401, {"message": "Authorization has been denied for this request."}
            )
            return
        if len(parts) not in (5, 6) or parts[4] != "activities":
            await self.send_body(send, 404, b"Not Found", [("content-type", "text/plain")])
            return
        conversation = unquote(parts[3])
        failure = await self.next_failure()
        if failure is not None:
            await self.send_json(
                send, failure.status, {"error": {"code": "ServiceError", "message": "failed"}}
            )
            return
        body = request.json
        if not isinstance(body, dict) or body.get("type") != "message":
            await self.send_json(
                send, 400, {"error": {"code": "BadArgument", "message": "invalid activity"}}
            )
            return
        if request.method == "POST" and len(parts) == 5:
            activity_id = f"1:{secrets.token_urlsafe(16)}"
            self._activity_ids.add((conversation, activity_id))
            self.activities.append((conversation, body))
            await self.send_json(send, 201, {"id": activity_id})
        elif request.method == "PUT" and len(parts) == 6:
            activity_id = unquote(parts[5])
            if (conversation, activity_id) not in self._activity_ids:
                await self.send_json(
                    send, 404, {"error": {"code": "ActivityNotFoundInConversation"}}
                )
                return
            self.updates.append((conversation, activity_id, body))
            await self.send_json(send, 200, {"id": activity_id})
        else:
            await self.send_body(send, 405, b"", [])

    async def _workflow(self, request: RecordedRequest, send: Send) -> None:
        if await self._failed(send):
            return
        try:
            body = request.json
        except ValueError:
            body = None
        attachments = body.get("attachments") if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or body.get("type") != "message"
            or not isinstance(attachments, list)
            or not attachments
            or attachments[0].get("contentType") != "application/vnd.microsoft.card.adaptive"
        ):
            await self.send_json(
                send,
                400,
                {"error": {"code": "InvalidRequestContent", "message": "not an adaptive card"}},
            )
            return
        self.posted.append(body)
        await self.send_body(send, 202, b"", [("x-ms-workflow-run-id", uuid.uuid4().hex)])
