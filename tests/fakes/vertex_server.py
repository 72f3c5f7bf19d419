"""Real loopback servers that speak Vertex AI's model endpoints and Google's OAuth 2.0 token
endpoint, for the `vertex` provider kind.

    info, key = service_account(token_uri=f"{tokens.url}/token")   # RSA key made per test
    async with GoogleTokenFake(info) as tokens, VertexFake(tokens=tokens) as vertex:
        ...  # GOOGLE_APPLICATION_CREDENTIALS=<info as a file>, base_url vertex.base_url

`GoogleTokenFake`: `POST /token`, the JWT-bearer grant (RFC 7523) that google-auth's
service-account credentials run (`google/oauth2/_client.py` `jwt_grant`): a form body with
`grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer` and `assertion`, an RS256 JWT signed
with the account's private key, whose `iss` is its `client_email`, `aud` Google's token URI
(google-auth's constant, wherever it posts), `scope` the scopes asked, `iat`/`exp` an hour
apart; the signature is checked with the account's public key. Answers `{"access_token",
"expires_in", "token_type": "Bearer"}` (`application/json; charset=utf-8`); a bad grant is
400 `{"error": "invalid_grant", "error_description": "Invalid JWT Signature."}` (or another
description), as oauth2.googleapis.com answers.

`VertexFake`: the Gemini fake (tests/fakes/gemini_server.py: its GenerateContentRequest
checks, its chunks and framing, Google's front-end headers) under Vertex's paths
`/v1/projects/{project}/locations/{location}/publishers/{publisher}/models/{model}:{method}`,
per the Vertex AI REST reference (cloud.google.com/vertex-ai/docs/reference/rest/v1/
projects.locations.publishers.models) and Anthropic's "Claude on Vertex AI" page with
anthropic-python's `lib/vertex/_client.py`:
- `google` publisher: `:generateContent`, `:streamGenerateContent?alt=sse` (answers add
  Vertex's `createTime`), `:predict` for the embedding models (`{instances: [{content,
  task_type?, title?}], parameters?: {outputDimensionality, autoTruncate}}` ->
  `{predictions: [{embeddings: {statistics: {token_count, truncated}, values}}], metadata:
  {billableCharacterCount}}`; gemini-embedding-001 takes one instance per request).
- `anthropic` publisher: `:rawPredict` / `:streamRawPredict` with Anthropic's Messages body,
  no `model` (the URL names it) and `anthropic_version: "vertex-2023-10-16"`; answered as
  the Anthropic fake answers (its checks of the body, its events and message JSON, from
  tests/fakes/anthropic_server.py); scripted `Reply` / `ErrorReply` objects answer there.
- `GET /v1/projects/{p}/locations/{l}`: the Location resource (`name`, `locationId`).
- Auth: `Authorization: Bearer <token>` issued by `tokens`; none or another -> 401
  UNAUTHENTICATED with ErrorInfo `ACCESS_TOKEN_TYPE_UNSUPPORTED` / `CREDENTIALS_MISSING`;
  another project -> 403 PERMISSION_DENIED; errors are Google's `{"error": {code, message,
  status, details?}}`.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any
from urllib.parse import parse_qs

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.fakes._loopback import LoopbackServer, RecordedRequest, Send, hashed_embedding
from tests.fakes.anthropic_server import (
    ErrorReply,
    Reply,
    _check,
    _echo,
    _frame,
    _message,
    message_events,
)
from tests.fakes.gemini_server import GeminiFake, GeminiTurn, google_error

__all__ = [
    "CLOUD_PLATFORM",
    "GoogleTokenFake",
    "VertexFake",
    "service_account",
]

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"
# What Vertex takes in `anthropic_version`: the value Anthropic's Vertex page documents, and the
# Messages API version anthropic-python 2.x's AnthropicVertex sends instead (its
# `_constants.ANTHROPIC_API_VERSION`, set with `setdefault` in `lib/vertex/_client.py`).
ANTHROPIC_VERSIONS = frozenset({VERTEX_ANTHROPIC_VERSION, "2026-10-21"})


def service_account(
    *, token_uri: str, project: str = "test-project", email: str | None = None
) -> tuple[dict[str, Any], bytes]:
    """A service-account key file's JSON (a fresh 2048-bit RSA key) and its public key PEM."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    email = email or f"orchestrator-test@{project}.iam.gserviceaccount.com"
    info = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": uuid.uuid4().hex,
        "private_key": private,
        "client_email": email,
        "client_id": str(uuid.uuid4().int)[:21],
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/"
        + email.replace("@", "%40"),
        "universe_domain": "googleapis.com",
    }
    return info, public


class GoogleTokenFake(LoopbackServer):
    """See the module docstring. Set `public_key` and `client_email` (or `account(...)`)."""

    label = "Google OAuth"
    json_type = "application/json; charset=utf-8"
    server_header = False

    @classmethod
    def json_text(cls, obj: Any) -> str:
        return json.dumps(obj, indent=2)

    @classmethod
    def peer_headers(cls) -> list[tuple[str, str]]:
        return [
            ("vary", "Origin"),
            ("vary", "X-Origin"),
            ("vary", "Referer"),
            ("cache-control", "private"),
            ("server", "scaffolding on HTTPServer2"),
            ("x-xss-protection", "0"),
            ("x-frame-options", "SAMEORIGIN"),
            ("x-content-type-options", "nosniff"),
        ]

    def __init__(self, *, expires_in: int = 3599) -> None:
        super().__init__()
        self.token_uri = f"{self.url}/token"
        self.expires_in = expires_in
        self.public_key: bytes | None = None
        self.client_email = ""
        self.issued: list[str] = []
        self.claims: list[dict[str, Any]] = []

    def account(self, project: str = "test-project") -> dict[str, Any]:
        """A service account whose `token_uri` is this server, trusted by it."""
        info, public = service_account(token_uri=self.token_uri, project=project)
        self.public_key, self.client_email = public, info["client_email"]
        return info

    async def _invalid(self, send: Send, description: str) -> None:
        self.violations.append(description)
        await self.send_json(
            send, 400, {"error": "invalid_grant", "error_description": description}
        )

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        if request.method != "POST" or request.path != "/token":
            await self.send_json(send, 404, {"error": "not_found"})
            return
        form = {k: v[-1] for k, v in parse_qs(request.raw.decode()).items()}
        if form.get("grant_type") != JWT_BEARER:
            await self.send_json(
                send,
                400,
                {"error": "unsupported_grant_type", "error_description": "Invalid grant_type: "},
            )
            return
        if self.public_key is None:
            await self._invalid(send, "Invalid JWT Signature.")
            return
        try:
            claims = jwt.decode(
                form.get("assertion", ""),
                self.public_key,
                algorithms=["RS256"],
                # google-auth addresses its assertions to Google's token URI whatever
                # `token_uri` it posts them to (google/oauth2/service_account.py)
                audience=[GOOGLE_TOKEN_URI, self.token_uri],
            )
        except jwt.ExpiredSignatureError:
            await self._invalid(
                send,
                (
                    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a "
                    "reasonable timeframe. Check your iat and exp values in the JWT claim."
                ),
            )
            return
        except jwt.PyJWTError:
            await self._invalid(send, "Invalid JWT Signature.")
            return
        if claims.get("iss") != self.client_email:
            await self._invalid(send, "Invalid JWT: Failed audience check.")
            return
        if CLOUD_PLATFORM not in str(claims.get("scope", "")).split():
            await self._invalid(send, "Invalid OAuth scope or ID token audience provided.")
            return
        if int(claims.get("exp", 0)) - int(claims.get("iat", 0)) > 3600:
            await self._invalid(send, "Invalid JWT: Token must be a short-lived token.")
            return
        self.claims.append(claims)
        token = "ya29.c." + base64.urlsafe_b64encode(uuid.uuid4().bytes * 3).decode().rstrip("=")
        self.issued.append(token)
        await self.send_json(
            send,
            200,
            {"access_token": token, "expires_in": self.expires_in, "token_type": "Bearer"},
        )


class VertexFake(GeminiFake):
    """See the module docstring."""

    label = "Vertex AI"

    def __init__(
        self,
        *,
        tokens: GoogleTokenFake,
        project: str = "test-project",
        location: str = "us-central1",
    ) -> None:
        super().__init__(api_key="", prefix="/v1")
        self.tokens = tokens
        self.project = project
        self.location = location
        self.embed_models = {
            "text-embedding-005",
            "text-multilingual-embedding-002",
            "gemini-embedding-001",
        }
        self.anthropic_models = {"claude-sonnet-4-5@20250929", "claude-haiku-4-5@20251001"}

    @property
    def claude_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if "/publishers/anthropic/" in r.path]

    async def _unauthenticated(self, send: Send, reason: str) -> None:
        message = (
            "Request had invalid authentication credentials. Expected OAuth 2 access token, "
            "login cookie or other valid authentication credential. See "
            "https://developers.google.com/identity/sign-in/web/devconsole-project."
        )
        detail = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": "googleapis.com",
            "metadata": {"service": "aiplatform.googleapis.com", "method": "predict"},
        }
        body = {
            "error": {
                "code": 401,
                "message": message,
                "status": "UNAUTHENTICATED",
                "details": [detail],
            }
        }
        await self.send_json(
            send, 401, body, [("www-authenticate", 'Bearer realm="https://accounts.google.com/"')]
        )

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        auth = request.headers.get("authorization", "")
        if not auth:
            await self._unauthenticated(send, "CREDENTIALS_MISSING")
            return
        if not auth.startswith("Bearer ") or auth.removeprefix("Bearer ") not in self.tokens.issued:
            await self._unauthenticated(send, "ACCESS_TOKEN_TYPE_UNSUPPORTED")
            return
        path = request.path.removeprefix(self.prefix)
        parts = path.split("/")
        # ["", "projects", p, "locations", l, ...]
        if len(parts) < 5 or parts[1] != "projects" or parts[3] != "locations":
            await self.send_json(send, 404, google_error(404, f"Method not found: {path}"))
            return
        project, location, rest = parts[2], parts[4], parts[5:]
        if project != self.project:
            message = (
                f"Permission 'aiplatform.endpoints.predict' denied on resource "
                f"'//aiplatform.googleapis.com/projects/{project}/locations/{location}' "
                "(or it may not exist)."
            )
            await self.send_json(send, 403, google_error(403, message))
            return
        if location != self.location:
            await self.send_json(
                send, 400, google_error(400, f"Unsupported region for this endpoint: {location}")
            )
            return
        if request.method == "GET" and not rest:
            name = f"projects/{project}/locations/{location}"
            await self.send_json(send, 200, {"name": name, "locationId": location})
            return
        if (
            request.method == "POST"
            and len(rest) == 4
            and rest[0] == "publishers"
            and rest[2] == "models"
            and ":" in rest[3]
        ):
            publisher = rest[1]
            model, _, method = rest[3].partition(":")
            sse = parse_qs(request.query).get("alt") == ["sse"]
            if publisher == "google" and method in ("generateContent", "streamGenerateContent"):
                await self._generate(request, send, model, method, sse)
                return
            if publisher == "google" and method == "predict":
                await self._predict(request, send, model)
                return
            if publisher == "anthropic" and method in ("rawPredict", "streamRawPredict"):
                await self._claude(request, send, model, method == "streamRawPredict")
                return
        await self.send_json(
            send, 404, google_error(404, f"Method not found: {request.method} {request.path}")
        )

    # --- Gemini: the Generative Language answers plus Vertex's createTime ------------------
    def chunks(self, turn: GeminiTurn) -> list[dict[str, Any]]:
        created = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        return [{**c, "createTime": created} for c in super().chunks(turn)]

    def whole(self, turn: GeminiTurn) -> dict[str, Any]:
        created = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        return {**super().whole(turn), "createTime": created}

    async def _predict(self, request: RecordedRequest, send: Send, model: str) -> None:
        try:
            body = request.json
        except ValueError:
            await self.send_json(send, 400, google_error(400, "Invalid JSON payload received."))
            return
        problems = _predict_problems(body, model)
        if problems:
            self.violations.extend(problems)
            await self.send_json(send, 400, google_error(400, "; ".join(problems)))
            return
        with self._lock:  # only a scripted failure answers here; a chat's reply stays queued
            head = self._script[0] if self._script else None
            turn = (
                self._script.popleft()
                if isinstance(head, GeminiTurn) and head.status >= 400
                else None
            )
        if turn is not None:
            await self.send_json(send, turn.status, turn.error or google_error(turn.status, ""))
            return
        if model not in self.embed_models:
            message = (
                f"Publisher Model `projects/{self.project}/locations/{self.location}/"
                f"publishers/google/models/{model}` was not found or your project does not "
                "have access to it."
            )
            await self.send_json(send, 404, google_error(404, message))
            return
        dims = (body.get("parameters") or {}).get("outputDimensionality")
        predictions = []
        characters = 0
        for instance in body["instances"]:
            text = str(instance["content"])
            characters += len(text.replace(" ", ""))
            values = hashed_embedding(text, self.embedding_dim)
            if dims:
                values = values[:dims]
            statistics = {"token_count": len(text.split()), "truncated": False}
            predictions.append({"embeddings": {"statistics": statistics, "values": values}})
        await self.send_json(
            send,
            200,
            {"predictions": predictions, "metadata": {"billableCharacterCount": characters}},
        )

    # --- Claude: Anthropic's Messages at rawPredict / streamRawPredict ---------------------
    async def _claude(
        self, request: RecordedRequest, send: Send, model: str, streamed: bool
    ) -> None:
        try:
            body = request.json
        except ValueError:
            await self.send_json(send, 400, google_error(400, "Invalid JSON payload received."))
            return
        problem = _claude_problem(body, model, streamed)
        if problem is not None:
            self.violations.append(problem)
            error = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": problem},
            }
            await self.send_json(send, 400, error)
            return
        if model not in self.anthropic_models:
            message = (
                f"Publisher Model `projects/{self.project}/locations/{self.location}/"
                f"publishers/anthropic/models/{model}` not found."
            )
            await self.send_json(send, 404, google_error(404, message))
            return
        reply = self.next_reply()
        if reply is None:
            reply = _echo(body)
        elif callable(reply):
            reply = reply(body)
        if isinstance(reply, GeminiTurn):  # a Google-side failure (quota, 5xx)
            await self.send_json(send, reply.status, reply.error or google_error(reply.status, ""))
            return
        if isinstance(reply, ErrorReply):
            error = {"type": "error", "error": {"type": reply.type, "message": reply.message}}
            await self.send_json(send, reply.status, error, list(reply.headers.items()))
            return
        assert isinstance(reply, Reply)
        message_id = reply.id or f"msg_vrtx_{uuid.uuid4().hex[:24]}"
        name = reply.model or model.partition("@")[0]
        if not streamed:
            await self.send_json(send, 200, _message(reply, name, message_id))
            return
        frames = [_frame(n, d) for n, d in message_events(reply, name, message_id)]
        drop = reply.drop_after is not None
        if reply.drop_after is not None:
            frames = frames[: reply.drop_after]
        await self.send_stream(
            send,
            [("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache")],
            frames,
            fail_after=len(frames) if drop else None,
            delay_s=reply.delay_s,
        )


def _predict_problems(body: Any, model: str) -> list[str]:
    if not isinstance(body, dict):
        return ["Invalid JSON payload received. Expected an object."]
    problems = [
        f'Invalid JSON payload received. Unknown name "{k}": Cannot find field.'
        for k in body
        if k not in ("instances", "parameters")
    ]
    instances = body.get("instances")
    if not isinstance(instances, list) or not instances:
        return [*problems, "instances: at least one instance is required"]
    if model.startswith("gemini-embedding") and len(instances) > 1:
        problems.append(
            "Unable to submit request because the model supports up to 1 instances per "
            "request, but 2 or more were given."
        )
    elif len(instances) > 250:
        problems.append("instances: at most 250 instances per request")
    for n, instance in enumerate(instances):
        if not isinstance(instance, dict) or not isinstance(instance.get("content"), str):
            problems.append(f"instances[{n}].content: a string is required")
        elif unknown := sorted(set(instance) - {"content", "task_type", "title"}):
            problems.append(f"instances[{n}]: unknown fields {unknown}")
    parameters = body.get("parameters")
    if parameters is not None and (
        not isinstance(parameters, dict)
        or set(parameters) - {"outputDimensionality", "autoTruncate"}
    ):
        problems.append(f"parameters: unknown fields in {parameters!r}")
    return problems


def _claude_problem(body: Any, model: str, streamed: bool) -> str | None:
    if not isinstance(body, dict):
        return "body: Input should be an object"
    if "model" in body:
        return "model: Extra inputs are not permitted"
    if body.get("anthropic_version") not in ANTHROPIC_VERSIONS:
        return f"anthropic_version: Input should be '{VERTEX_ANTHROPIC_VERSION}'"
    if bool(body.get("stream")) != streamed:
        return "stream: must be true for streamRawPredict and absent or false for rawPredict"
    rest = {k: v for k, v in body.items() if k != "anthropic_version"}
    return _check({**rest, "model": model}, True)
