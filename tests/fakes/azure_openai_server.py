"""Real loopback servers that speak Azure OpenAI's data plane and Microsoft Entra ID's token
endpoint byte for byte, for the `azure_openai` provider kind.

    async with EntraFake() as entra, AzureOpenAIFake(entra=entra) as azure:
        azure.script([FakeReply(text="hi")])
        ...  # endpoint azure.url, authority entra.url

`AzureOpenAIFake` is the OpenAI fake (tests/fakes/openai_server.py: its scripting, its SSE
framing, its CreateChatCompletionRequest check of every chat body) under Azure's routes:
- `POST /openai/deployments/{deployment}/chat/completions?api-version=V`
- `POST /openai/deployments/{deployment}/embeddings?api-version=V`
- `GET /openai/models?api-version=V`
with Azure's differences, as its REST reference (learn.microsoft.com/azure/ai-foundry/openai/
reference, api-version 2024-10-21, the inference OpenAPI document in Azure/azure-rest-api-specs
`specification/cognitiveservices/data-plane/AzureOpenAI/inference/stable/2024-10-21`) and the
openai-python Azure client (`lib/azure.py`) document them:
- auth: the `api-key` header, or `Authorization: Bearer <token>` with a token `entra` issued;
  neither -> 401 `{"error": {"code": "401", "message": "Access denied due to invalid
  subscription key or wrong API endpoint. ..."}}`; a bad bearer -> 401 "Unauthorized. Access
  token is missing, invalid, audience is incorrect ..., or have expired."
- no `api-version` -> 404 `{"error": {"code": "404", "message": "Resource not found"}}`; one
  not in `api_versions` -> 400 `{"error": {"code": "BadRequest", "message": "API version not
  supported"}}`; an unknown deployment -> 404 `DeploymentNotFound`.
- answers carry `prompt_filter_results` (per prompt: hate, jailbreak, self_harm, sexual,
  violence) and each choice `content_filter_results` (hate, protected_material_code,
  protected_material_text, self_harm, sexual, violence); a stream opens with a chunk whose
  `choices` is empty, `id`/`model`/`object` are "" and `created` is 0, carrying only
  `prompt_filter_results`; each later chunk's choice has `content_filter_results` ({} on the
  role and finish chunks). JSON keys come sorted and compact, as Azure's front writes them.
- headers: `apim-request-id`, `x-request-id`, `x-ms-region`, `x-ms-rai-invoked`,
  `x-ms-client-request-id`, `azureml-model-session`, `x-ratelimit-remaining-requests` /
  `-tokens`, `strict-transport-security`, `x-content-type-options`; JSON `application/json`,
  streams `text/event-stream; charset=utf-8`.
Azure's error helpers: `azure_rate_limited(retry_after)` (429 with `retry-after` and
`x-ratelimit-reset-requests`, Azure's message), `azure_content_filtered()` (400,
`code: content_filter`, `innererror.code: ResponsibleAIPolicyViolation`).

`EntraFake` is `POST /{tenant}/oauth2/v2.0/token` (client credentials, RFC 6749 4.4, as
Microsoft's identity-platform "OAuth 2.0 client credentials flow" page documents it): a form
body with grant_type, client_id, client_secret, scope; answers `{"token_type": "Bearer",
"expires_in", "ext_expires_in", "access_token"}`; a wrong secret is 401 `invalid_client`
(AADSTS7000215), an unknown client 400 `unauthorized_client` (AADSTS700016), an unknown
tenant 400 `invalid_request` (AADSTS90002), a scope other than the Cognitive Services one 400
`invalid_scope` (AADSTS70011); errors add `error_codes`, `timestamp`, `trace_id`,
`correlation_id`, `error_uri`. Headers as login.microsoftonline.com sends them
(`cache-control: no-store, no-cache`, `pragma: no-cache`, `x-ms-request-id`,
`x-ms-ests-server`, `p3p`, `strict-transport-security`); JSON `application/json;
charset=utf-8`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from tests.fakes._loopback import LoopbackServer
from tests.fakes._loopback import RecordedRequest as LoopbackRequest
from tests.fakes._loopback import Send as LoopbackSend
from tests.fakes.openai_server import FakeReply, OpenAIFake, RecordedRequest

__all__ = [
    "API_VERSIONS",
    "COGNITIVE_SCOPE",
    "AzureOpenAIFake",
    "AzureRequest",
    "EntraFake",
    "azure_content_filtered",
    "azure_error",
    "azure_rate_limited",
]

COGNITIVE_SCOPE = "https://cognitiveservices.azure.com/.default"
API_VERSIONS = frozenset({"2024-06-01", "2024-10-21", "2025-01-01-preview"})
_SAFE = {"filtered": False, "severity": "safe"}
_NOT_DETECTED = {"detected": False, "filtered": False}
_EMBED_FIELDS = frozenset({"input", "user", "input_type", "encoding_format", "dimensions", "model"})


def azure_error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **extra}


def azure_rate_limited(retry_after: int = 6) -> FakeReply:
    message = (
        "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version "
        "2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. "
        f"Please retry after {retry_after} seconds. Go here: https://aka.ms/oai/quotaincrease "
        "if you would like to further increase the default rate limit."
    )
    return FakeReply(
        status=429,
        error=azure_error("429", message),
        headers={"retry-after": str(retry_after), "x-ratelimit-reset-requests": str(retry_after)},
    )


def azure_content_filtered() -> FakeReply:
    message = (
        "The response was filtered due to the prompt triggering Azure OpenAI's content "
        "management policy. Please modify your prompt and retry. To learn more about our "
        "content filtering policies please read our documentation: "
        "https://go.microsoft.com/fwlink/?linkid=2198766"
    )
    inner = {
        "code": "ResponsibleAIPolicyViolation",
        "content_filter_result": {
            "hate": _SAFE,
            "jailbreak": _NOT_DETECTED,
            "self_harm": _SAFE,
            "sexual": _SAFE,
            "violence": {"filtered": True, "severity": "high"},
        },
    }
    error = azure_error(
        "content_filter", message, param="prompt", status=400, type=None, innererror=inner
    )
    return FakeReply(status=400, error=error)


def _prompt_filters() -> list[dict[str, Any]]:
    results = {
        "hate": _SAFE,
        "jailbreak": _NOT_DETECTED,
        "self_harm": _SAFE,
        "sexual": _SAFE,
        "violence": _SAFE,
    }
    return [{"content_filter_results": results, "prompt_index": 0}]


def _choice_filters(filtered: bool = False) -> dict[str, Any]:
    violence = {"filtered": True, "severity": "high"} if filtered else _SAFE
    return {
        "hate": _SAFE,
        "protected_material_code": _NOT_DETECTED,
        "protected_material_text": _NOT_DETECTED,
        "self_harm": _SAFE,
        "sexual": _SAFE,
        "violence": violence,
    }


def _sorted(obj: Any) -> Any:
    """`obj` with every object's keys in order (Azure's front writes them sorted)."""
    if isinstance(obj, dict):
        return {k: _sorted(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_sorted(v) for v in obj]
    return obj


@dataclass
class AzureRequest(RecordedRequest):
    query: str = ""

    @property
    def api_version(self) -> str | None:
        values = parse_qs(self.query).get("api-version")
        return values[0] if values else None


class AzureOpenAIFake(OpenAIFake):
    """See the module docstring. `deployments`: deployment name -> model it serves."""

    def __init__(
        self,
        *,
        api_key: str | None = "azure-test-key",
        entra: EntraFake | None = None,
        deployments: Mapping[str, str] | None = None,
        embedding_deployments: Iterable[str] = ("text-embedding-3-small",),
        api_versions: Iterable[str] = API_VERSIONS,
    ) -> None:
        super().__init__(api_key=None, prefix="/openai", embedding_dim=1536, profile="openai")
        self.key = api_key
        self.entra = entra
        self.deployments = dict(deployments or {"gpt-4o-mini": "gpt-4o-mini", "gpt-4o": "gpt-4o"})
        self.embedding_deployments = set(embedding_deployments)
        self.api_versions = set(api_versions)
        self.filtered_output = False  # choices' content_filter_results flag violence

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    # --- the ASGI app ---------------------------------------------------------------------
    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method, path = scope["method"], scope["path"]
        request = AzureRequest(
            method, path, headers, raw, query=scope["query_string"].decode("latin-1")
        )
        self.requests.append(request)
        version = request.api_version
        if version is None:
            await self._json(send, 404, {"error": azure_error("404", "Resource not found")})
            return
        if version not in self.api_versions:
            error = azure_error("BadRequest", "API version not supported")
            await self._json(send, 400, {"error": error})
            return
        problem = self._auth_problem(headers)
        if problem is not None:
            await self._json(send, 401, {"error": azure_error("401", problem)})
            return
        if method == "GET" and path == "/openai/models":
            await self._azure_models(send)
            return
        parts = path.split("/")
        # ["", "openai", "deployments", "{deployment}", "chat", "completions"]
        if method == "POST" and len(parts) >= 5 and parts[1:3] == ["openai", "deployments"]:
            deployment, operation = parts[3], "/".join(parts[4:])
            if operation == "chat/completions" and deployment in self.deployments:
                await self._chat(send, raw)
                return
            if operation == "embeddings" and deployment in self.embedding_deployments:
                await self._azure_embeddings(send, raw)
                return
            if operation in ("chat/completions", "embeddings"):
                message = (
                    "The API deployment for this resource does not exist. If you created the "
                    "deployment within the last 5 minutes, please wait a moment and try again."
                )
                error = azure_error("DeploymentNotFound", message)
                await self._json(send, 404, {"error": error})
                return
        await self._json(send, 404, {"error": azure_error("404", "Resource not found")})

    def _auth_problem(self, headers: Mapping[str, str]) -> str | None:
        key = headers.get("api-key")
        if key is not None and self.key is not None and key == self.key:
            return None
        bearer = headers.get("authorization", "")
        if bearer.startswith("Bearer ") and key is None:
            if self.entra is not None and bearer.removeprefix("Bearer ") in self.entra.issued:
                return None
            return (
                "Unauthorized. Access token is missing, invalid, audience is incorrect "
                "(https://cognitiveservices.azure.com), or have expired."
            )
        return (
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure "
            "to provide a valid key for an active subscription and use a correct regional API "
            "endpoint for your resource."
        )

    async def _azure_models(self, send: Any) -> None:
        data = [
            {
                "id": model,
                "object": "model",
                "created_at": 1715558400,
                "status": "succeeded",
                "capabilities": {"chat_completion": True, "completion": False},
                "lifecycle_status": "generally-available",
            }
            for model in sorted(set(self.deployments.values()))
        ]
        await self._json(send, 200, {"data": data, "object": "list"})

    async def _azure_embeddings(self, send: Any, raw: bytes) -> None:
        try:
            body = json.loads(raw)
        except ValueError:
            await self._json(send, 400, {"error": azure_error("BadRequest", "Invalid JSON")})
            return
        unknown = sorted(set(body) - _EMBED_FIELDS) if isinstance(body, dict) else ["body"]
        if unknown:
            problem = f"Unrecognized request argument supplied: {', '.join(unknown)}"
            self.violations.append(problem)
            await self._json(send, 400, {"error": azure_error("BadRequest", problem)})
            return
        await self._embeddings(send, raw)

    # --- Azure's answers ------------------------------------------------------------------
    async def _json(
        self, send: Any, status: int, obj: Any, extra: Mapping[str, str] | None = None
    ) -> None:
        text = json.dumps(_sorted(obj), ensure_ascii=False, separators=(",", ":"))
        await self._bytes(send, status, text.encode(), extra)

    def _headers(self, content_type: str, status: int, length: int | None) -> list[tuple[str, str]]:
        request_id = str(uuid.uuid4())
        headers = [("content-type", content_type)]
        if length is not None:
            headers.append(("content-length", str(length)))
        headers += [
            ("apim-request-id", request_id),
            ("strict-transport-security", "max-age=31536000; includeSubDomains; preload"),
            ("x-content-type-options", "nosniff"),
            ("x-ms-region", "East US"),
            ("x-ratelimit-remaining-requests", "99"),
            ("x-ratelimit-remaining-tokens", "99989"),
            ("x-ms-rai-invoked", "true"),
            ("x-request-id", request_id),
            ("x-ms-client-request-id", "Not-Set"),
            ("azureml-model-session", "d008-20241010185829"),
        ]
        return headers

    def completion(self, reply: FakeReply, model: str, completion_id: str) -> dict[str, Any]:
        body = super().completion(reply, model, completion_id)
        body.pop("service_tier", None)
        body["prompt_filter_results"] = _prompt_filters()
        for choice in body["choices"]:
            choice["message"].pop("annotations", None)
            choice["content_filter_results"] = _choice_filters(self.filtered_output)
        out: dict[str, Any] = _sorted(body)
        return out

    def chunks(
        self, reply: FakeReply, model: str, completion_id: str, include_usage: bool
    ) -> list[dict[str, Any]]:
        out = super().chunks(reply, model, completion_id, include_usage)
        for n, chunk in enumerate(out):
            for choice in chunk["choices"]:
                content = choice["delta"].get("content") or choice["delta"].get("tool_calls")
                last = choice.get("finish_reason") is not None
                filtered = self.filtered_output and last
                choice["content_filter_results"] = (
                    _choice_filters(filtered) if (content and n) or filtered else {}
                )
        opening: dict[str, Any] = {
            "choices": [],
            "created": 0,
            "id": "",
            "model": "",
            "object": "",
            "prompt_filter_results": _prompt_filters(),
        }
        return [_sorted(c) for c in [opening, *out]]


class EntraFake(LoopbackServer):
    """See the module docstring."""

    label = "Entra ID"
    json_type = "application/json; charset=utf-8"
    server_header = False

    @classmethod
    def json_text(cls, obj: Any) -> str:
        return json.dumps(obj, separators=(",", ":"))

    def __init__(
        self,
        *,
        tenant_id: str = "11111111-2222-3333-4444-555555555555",
        client_id: str = "66666666-7777-8888-9999-000000000000",
        client_secret: str = "entra-test-secret",
        expires_in: int = 3599,
    ) -> None:
        super().__init__()
        self.tenant_id = tenant_id
        self.client_id = client_id
        self.client_secret = client_secret
        self.expires_in = expires_in
        self.issued: list[str] = []

    @property
    def token_requests(self) -> list[LoopbackRequest]:
        return [r for r in self.requests if r.path.endswith("/oauth2/v2.0/token")]

    @classmethod
    def peer_headers(cls) -> list[tuple[str, str]]:
        return [
            ("cache-control", "no-store, no-cache"),
            ("pragma", "no-cache"),
            ("expires", "-1"),
            ("strict-transport-security", "max-age=31536000; includeSubDomains"),
            ("x-content-type-options", "nosniff"),
            ("p3p", 'CP="DSP CUR OTPi IND OTRi ONL FIN"'),
            ("x-ms-request-id", str(uuid.uuid4())),
            ("x-ms-ests-server", "2.1.19200.4 - SCUS ProdSlices"),
            ("x-xss-protection", "0"),
        ]

    async def _oauth_error(
        self, send: LoopbackSend, status: int, error: str, code: int, text: str
    ) -> None:
        trace = str(uuid.uuid4())
        stamp = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime())
        body = {
            "error": error,
            "error_description": f"AADSTS{code}: {text} Trace ID: {trace} Correlation ID: "
            f"{uuid.uuid4()} Timestamp: {stamp}",
            "error_codes": [code],
            "timestamp": stamp,
            "trace_id": trace,
            "correlation_id": str(uuid.uuid4()),
            "error_uri": f"https://login.microsoftonline.com/error?code={code}",
        }
        await self.send_json(send, status, body)

    async def handle(self, request: LoopbackRequest, send: LoopbackSend) -> None:
        tenant, _, rest = request.path.removeprefix("/").partition("/")
        if request.method != "POST" or rest != "oauth2/v2.0/token":
            await self.send_body(send, 404, b"", [])
            return
        if tenant != self.tenant_id:
            text = (
                f"Tenant '{tenant}' not found. Check to make sure you have the correct tenant ID."
            )
            await self._oauth_error(send, 400, "invalid_request", 90002, text)
            return
        if not request.headers.get("content-type", "").startswith(
            "application/x-www-form-urlencoded"
        ):
            text = "The request body must contain the following parameter: 'grant_type'."
            await self._oauth_error(send, 400, "invalid_request", 900144, text)
            return
        form = {k: v[-1] for k, v in parse_qs(request.raw.decode()).items()}
        if form.get("grant_type") != "client_credentials":
            text = "The request body must contain the following parameter: 'grant_type'."
            await self._oauth_error(send, 400, "invalid_request", 900144, text)
            return
        if form.get("client_id") != self.client_id:
            text = (
                f"Application with identifier '{form.get('client_id')}' was not found in the "
                f"directory '{tenant}'."
            )
            await self._oauth_error(send, 400, "unauthorized_client", 700016, text)
            return
        if form.get("client_secret") != self.client_secret:
            text = (
                "Invalid client secret provided. Ensure the secret being sent in the request "
                f"is the client secret value, not the client secret ID, for a secret added to "
                f"app '{self.client_id}'."
            )
            await self._oauth_error(send, 401, "invalid_client", 7000215, text)
            return
        if form.get("scope") != COGNITIVE_SCOPE:
            text = (
                "The provided value for the input parameter 'scope' is not valid. The scope "
                f"{form.get('scope')} is not valid."
            )
            await self._oauth_error(send, 400, "invalid_scope", 70011, text)
            return
        token = f"eyJ0eXAiOiJKV1Qi.{uuid.uuid4().hex}.{uuid.uuid4().hex}"
        self.issued.append(token)
        await self.send_json(
            send,
            200,
            {
                "token_type": "Bearer",
                "expires_in": self.expires_in,
                "ext_expires_in": self.expires_in,
                "access_token": token,
            },
        )
