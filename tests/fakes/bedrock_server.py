"""A real loopback HTTP server that speaks Bedrock Runtime's Converse API byte for byte, and
checks every request's SigV4 signature the way AWS does.

    async with BedrockFake() as server:
        server.script(BedrockTurn(text="Hello!"))
        ...  # an adapter with base_url=server.url, region/keys = server's

On the wire as AWS answers (the ConverseStream and event-stream encoding references of the
Bedrock Runtime API, and botocore's `EventStreamBuffer` that parses it): `content-type:
application/vnd.amazon.eventstream` (binary, no charset) with `x-amzn-requestid`; JSON payloads
and answers are raw UTF-8, `application/json` without a charset.

Routes:
- `POST /model/{modelId}/converse-stream`: `application/vnd.amazon.eventstream`, binary
  frames (prelude with total and header lengths and its CRC32, typed headers
  `:event-type`, `:content-type`, `:message-type`, a JSON payload, the message CRC32) for
  messageStart, contentBlockDelta (reasoningContent text then signature, text pieces),
  contentBlockStart/Delta (toolUse id and name, then `input` fragments), contentBlockStop,
  messageStop `{stopReason}` and metadata `{usage, metrics}`; every payload padded with
  Bedrock's `p` field. `exception_after=N` sends N frames then an exception frame
  (`:message-type` exception, `:exception-type`), `fail_after=N` drops the connection after
  N frames, `byte_chunk=K` sends the body in K-byte slices that cut frames anywhere.
- `POST /model/{modelId}/converse`: the same turn as one Converse answer
  `{output: {message: {role, content}}, stopReason, usage, metrics}`.
- `POST /model/{modelId}/invoke` (InvokeModel) for the embedding models: Titan Text
  Embeddings (`amazon.titan-embed-text-v2:0`: `{inputText, dimensions?, normalize?}` ->
  `{embedding, inputTextTokenCount, embeddingsByType}`, dimensions 1024 (default), 512 or
  256, else AWS's 400 ValidationException; v1 takes `inputText` only, 1536 dimensions) and
  Cohere Embed (`cohere.embed-*`: `{texts, input_type, ...}` -> `{embeddings, id,
  response_type, texts}`, 1024 dimensions); bodies checked with `bedrock_embed_problems`; any
  other model id is AWS's 400 "The provided model identifier is invalid."
- `POST /model/{modelId}/count-tokens` (CountTokens): `{"input": {"converse": {messages,
  system?, toolConfig?}}}` (botocore's CountTokensInput / ConverseTokensRequest; the converse
  part checked like a Converse body) -> `{"inputTokens": N}` (`token_count`, else the body's
  size / 4).
- `GET /foundation-models`: a ListFoundationModels answer.

The model id path segment is percent-decoded (ARNs arrive encoded); each request records it
in `model_ids`. Errors are `{"message": ...}` with `x-amzn-errortype`. A request whose SigV4
Authorization is missing, names an unknown key, another service/region, or does not match
the signature recomputed (with botocore, from the known secret, the signed headers, path,
query and body) gets AWS's 403. With `session_token` set the keys are temporary (STS): a
request must carry that token in a signed `X-Amz-Security-Token`, else AWS's 403
UnrecognizedClientException.
"""

from __future__ import annotations

import binascii
import hmac
import json
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.fakes._loopback import (
    LoopbackServer,
    RecordedRequest,
    Send,
    hashed_embedding,
    pieces,
)
from tests.fakes._wire_checks import bedrock_embed_problems, bedrock_problems

__all__ = [
    "BedrockFake",
    "BedrockTurn",
    "encode_frame",
    "event_frame",
    "exception_frame",
    "verify_sigv4",
]

ACCESS_KEY = "AKIDEXAMPLE0TESTKEY1"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
REGION = "us-east-1"
SERVICE = "bedrock"

_PADDING = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_CORAL = "http://internal.amazon.com/coral/com.amazon.bedrock/"


# --- the event-stream encoding -------------------------------------------------------------
def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    # name length (1 byte), name, value type 7 (string), value length (2 bytes), value
    return (
        struct.pack("!B", len(raw_name))
        + raw_name
        + b"\x07"
        + struct.pack("!H", len(raw_value))
        + raw_value
    )


def encode_frame(headers: Sequence[tuple[str, str]], payload: bytes) -> bytes:
    """One event-stream message: prelude (total length, headers length), prelude CRC32,
    headers, payload, message CRC32 (of everything before it)."""
    raw_headers = b"".join(_header(k, v) for k, v in headers)
    total = 4 + 4 + 4 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack("!II", total, len(raw_headers))
    prelude += struct.pack("!I", binascii.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + raw_headers + payload
    return message + struct.pack("!I", binascii.crc32(message) & 0xFFFFFFFF)


def event_frame(event_type: str, payload: dict[str, Any], *, pad: int = 0) -> bytes:
    body = dict(payload)
    if pad:
        body["p"] = _PADDING[:pad]
    return encode_frame(
        [
            (":event-type", event_type),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(),
    )


def exception_frame(exception_type: str, message: str) -> bytes:
    return encode_frame(
        [
            (":exception-type", exception_type),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        json.dumps({"message": message}).encode(),
    )


# --- SigV4 verification --------------------------------------------------------------------
def verify_sigv4(
    request: RecordedRequest,
    secrets: dict[str, str],
    *,
    region: str,
    service: str,
    now: datetime | None = None,
) -> tuple[str, str] | None:
    """None when the request carries a valid SigV4 signature; else AWS's (error type,
    message) for it."""
    auth = request.headers.get("authorization", "")
    amz_date = request.headers.get("x-amz-date", "")
    if not auth.startswith("AWS4-HMAC-SHA256 ") or not amz_date:
        return "MissingAuthenticationTokenException", "Missing Authentication Token"
    fields = dict(
        item.strip().split("=", 1) for item in auth.removeprefix("AWS4-HMAC-SHA256 ").split(",")
    )
    try:
        access_key, date, scope_region, scope_service, terminal = fields["Credential"].split("/")
        signed = fields["SignedHeaders"].split(";")
        signature = fields["Signature"]
    except (KeyError, ValueError):
        return (
            "IncompleteSignatureException",
            f"Authorization header requires existence of all fields: {auth}",
        )
    if access_key not in secrets:
        return (
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    if scope_service != service or scope_region != region or terminal != "aws4_request":
        return (
            "InvalidSignatureException",
            f"Credential should be scoped to correct service/region: '{service}' in '{region}'.",
        )
    stamp = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    if date != amz_date[:8] or abs(((now or datetime.now(UTC)) - stamp).total_seconds()) > 900:
        return "InvalidSignatureException", "Signature expired: the request time is out of range."
    if "host" not in signed or any(h not in request.headers for h in signed):
        return "InvalidSignatureException", "A signed header is missing from the request."
    if "x-amz-security-token" in request.headers and "x-amz-security-token" not in signed:
        return "InvalidSignatureException", "The security token must be signed."
    url = f"http://{request.headers['host']}{request.raw_path}"
    if request.query:
        url += f"?{request.query}"
    rebuilt = AWSRequest(
        method=request.method,
        url=url,
        data=request.raw,
        headers={h: request.headers[h] for h in signed},
    )
    rebuilt.context["timestamp"] = amz_date
    signer = SigV4Auth(Credentials(access_key, secrets[access_key]), service, region)
    canonical = signer.canonical_request(rebuilt)
    expected = signer.signature(signer.string_to_sign(rebuilt, canonical), rebuilt)
    if not hmac.compare_digest(expected, signature):
        return (
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method. Consult the service "
            "documentation for details.",
        )
    return None


# --- scripted turns ------------------------------------------------------------------------
@dataclass
class BedrockTurn:
    text: str = ""
    reasoning: str = ""
    reasoning_signature: str | None = None
    tool_uses: list[dict[str, Any]] = field(default_factory=list)  # {toolUseId, name, input}
    stop_reason: str = "end_turn"
    input_tokens: int = 25
    output_tokens: int = 12
    cache_read_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    chunk: int = 4
    args_chunk: int = 6
    status: int = 200
    error_type: str = ""
    message: str = ""
    exception_after: int | None = None
    exception: tuple[str, str] = (
        "throttlingException",
        "Too many requests, please wait before trying again.",
    )
    fail_after: int | None = None
    byte_chunk: int | None = None

    @classmethod
    def error(cls, status: int, error_type: str, message: str) -> BedrockTurn:
        return cls(status=status, error_type=error_type, message=message)

    def events(self) -> list[tuple[str, dict[str, Any]]]:
        """The ConverseStream events of this turn, in order."""
        out: list[tuple[str, dict[str, Any]]] = [("messageStart", {"role": "assistant"})]
        index = 0
        if self.reasoning:
            for piece in pieces(self.reasoning, self.chunk):
                delta = {"reasoningContent": {"text": piece}}
                out.append(("contentBlockDelta", {"contentBlockIndex": index, "delta": delta}))
            if self.reasoning_signature:
                delta = {"reasoningContent": {"signature": self.reasoning_signature}}
                out.append(("contentBlockDelta", {"contentBlockIndex": index, "delta": delta}))
            out.append(("contentBlockStop", {"contentBlockIndex": index}))
            index += 1
        if self.text:
            for piece in pieces(self.text, self.chunk):
                out.append(
                    ("contentBlockDelta", {"contentBlockIndex": index, "delta": {"text": piece}})
                )
            out.append(("contentBlockStop", {"contentBlockIndex": index}))
            index += 1
        for tool in self.tool_uses:
            start = {"toolUse": {"toolUseId": tool["toolUseId"], "name": tool["name"]}}
            out.append(("contentBlockStart", {"contentBlockIndex": index, "start": start}))
            for piece in pieces(json.dumps(tool.get("input", {})), self.args_chunk):
                delta = {"toolUse": {"input": piece}}
                out.append(("contentBlockDelta", {"contentBlockIndex": index, "delta": delta}))
            out.append(("contentBlockStop", {"contentBlockIndex": index}))
            index += 1
        out.append(("messageStop", {"stopReason": self.stop_reason}))
        out.append(("metadata", {"usage": self.usage(), "metrics": {"latencyMs": 412}}))
        return out

    def usage(self) -> dict[str, int]:
        usage = {
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "totalTokens": self.input_tokens + self.output_tokens,
        }
        cached = self.cache_read_input_tokens + self.cache_write_input_tokens
        if cached:  # TokenUsage: cache counts apart from inputTokens, in the total
            usage["totalTokens"] += cached
            usage["cacheReadInputTokens"] = self.cache_read_input_tokens
            usage["cacheWriteInputTokens"] = self.cache_write_input_tokens
        return usage

    def converse(self) -> dict[str, Any]:
        """The Converse (non-streaming) answer."""
        content: list[dict[str, Any]] = []
        if self.reasoning:
            reasoning: dict[str, Any] = {"text": self.reasoning}
            if self.reasoning_signature:
                reasoning["signature"] = self.reasoning_signature
            content.append({"reasoningContent": {"reasoningText": reasoning}})
        if self.text:
            content.append({"text": self.text})
        for tool in self.tool_uses:
            content.append(
                {
                    "toolUse": {
                        "toolUseId": tool["toolUseId"],
                        "name": tool["name"],
                        "input": tool.get("input", {}),
                    }
                }
            )
        return {
            "metrics": {"latencyMs": 412},
            "output": {"message": {"content": content, "role": "assistant"}},
            "stopReason": self.stop_reason,
            "usage": self.usage(),
        }


class BedrockFake(LoopbackServer):
    label = "Bedrock"
    json_type = "application/json"  # AWS names no charset

    def __init__(
        self,
        *,
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
        region: str = REGION,
        session_token: str | None = None,
    ) -> None:
        super().__init__()
        self.access_key, self.secret_key, self.region = access_key, secret_key, region
        self.session_token = session_token
        self.model_ids: list[str] = []
        self.rejected: list[tuple[str, str]] = []  # (error type, message) of 403s sent
        self.models_status = 200
        self.token_count: int | None = None  # CountTokens' answer (None: body size / 4)

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        problem = verify_sigv4(
            request, {self.access_key: self.secret_key}, region=self.region, service=SERVICE
        )
        sent_token = request.headers.get("x-amz-security-token")
        if problem is None and self.session_token is not None and sent_token != self.session_token:
            problem = (
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            )
        if problem is not None:
            self.rejected.append(problem)
            await self._error(send, 403, *problem)
            return
        segments = request.raw_path.split("/")
        if request.method == "GET" and request.raw_path == "/foundation-models":
            await self._foundation_models(send)
        elif (
            request.method == "POST"
            and len(segments) == 4
            and segments[1] == "model"
            and segments[3] in ("converse", "converse-stream")
        ):
            self.model_ids.append(unquote(segments[2]))
            await self._converse(request, send, stream=segments[3] == "converse-stream")
        elif request.method == "POST" and len(segments) == 4 and segments[3] == "count-tokens":
            self.model_ids.append(unquote(segments[2]))
            await self._count(request, send)
        elif request.method == "POST" and len(segments) == 4 and segments[3] == "invoke":
            self.model_ids.append(unquote(segments[2]))
            await self._invoke(request, send, unquote(segments[2]))
        else:
            await self._error(send, 404, "UnknownOperationException", "Unknown operation")

    @classmethod
    async def _error(cls, send: Send, status: int, error_type: str, message: str) -> None:
        await cls.send_json(
            send,
            status,
            {"message": message},
            [
                ("x-amzn-requestid", str(uuid.uuid4())),
                ("x-amzn-errortype", f"{error_type}:{_CORAL}"),
            ],
        )

    async def _foundation_models(self, send: Send) -> None:
        if self.models_status >= 400:
            await self._error(
                send,
                self.models_status,
                "AccessDeniedException",
                "You don't have access to the model.",
            )
            return
        model_id = "anthropic.claude-3-haiku-20240307-v1:0"
        summary = {
            "modelArn": f"arn:aws:bedrock:{self.region}::foundation-model/{model_id}",
            "modelId": model_id,
            "modelName": "Claude 3 Haiku",
            "providerName": "Anthropic",
            "inputModalities": ["TEXT", "IMAGE"],
            "outputModalities": ["TEXT"],
            "responseStreamingSupported": True,
            "customizationsSupported": [],
            "inferenceTypesSupported": ["ON_DEMAND"],
            "modelLifecycle": {"status": "ACTIVE"},
        }
        await self.send_json(send, 200, {"modelSummaries": [summary]})

    @property
    def invoke_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.raw_path.endswith("/invoke")]

    async def _invoke(self, request: RecordedRequest, send: Send, model_id: str) -> None:
        if not model_id.startswith(("amazon.titan-embed-text", "cohere.embed")):
            await self._error(
                send, 400, "ValidationException", "The provided model identifier is invalid."
            )
            return
        try:
            body = request.json
        except ValueError:
            await self._error(send, 400, "SerializationException", "Unexpected character")
            return
        problems = bedrock_embed_problems(body, model_id)
        if problems:
            self.violations.extend(problems)
            await self._error(send, 400, "ValidationException", "; ".join(problems))
            return
        headers = [("x-amzn-requestid", str(uuid.uuid4()))]
        if model_id.startswith("cohere.embed"):
            vectors = [hashed_embedding(t, 1024) for t in body["texts"]]
            answer = {
                "embeddings": vectors,
                "id": str(uuid.uuid4()),
                "response_type": "embeddings_floats",
                "texts": body["texts"],
            }
            await self.send_json(send, 200, answer, headers)
            return
        dim = 1536 if "-v1" in model_id else 1024
        if "dimensions" in body:
            if body["dimensions"] not in (256, 512, 1024):
                await self._error(
                    send,
                    400,
                    "ValidationException",
                    f"Malformed input request: #/dimensions: {body['dimensions']} is not a valid"
                    " enum value, please reformat your input and try again.",
                )
                return
            dim = body["dimensions"]
        vector = hashed_embedding(body["inputText"], dim)
        answer = {
            "embedding": vector,
            "inputTextTokenCount": len(body["inputText"].split()),
            "embeddingsByType": {"float": vector},
        }
        await self.send_json(send, 200, answer, headers)

    async def _count(self, request: RecordedRequest, send: Send) -> None:
        body = request.json
        converse = (body.get("input") or {}).get("converse") if isinstance(body, dict) else None
        problems = (
            ["input: exactly one of invokeModel, converse"]
            if not isinstance(converse, dict) or set(body) != {"input"} or len(body["input"]) != 1
            else [
                f"input.converse.{k}: not a ConverseTokensRequest field"
                for k in sorted(set(converse) - {"messages", "system", "toolConfig"})
            ]
            + bedrock_problems(converse)
        )
        if problems:
            self.violations.extend(problems)
            await self._error(send, 400, "ValidationException", "; ".join(problems))
            return
        count = self.token_count if self.token_count is not None else max(1, len(request.raw) // 4)
        await self.send_json(send, 200, {"inputTokens": count})

    async def _converse(self, request: RecordedRequest, send: Send, *, stream: bool) -> None:
        try:
            body = request.json
        except ValueError:
            await self._error(send, 400, "SerializationException", "Unexpected character")
            return
        problems = bedrock_problems(body)
        if problems:
            self.violations.extend(problems)
            await self._error(send, 400, "ValidationException", "; ".join(problems))
            return
        turn = self.next_reply() or BedrockTurn(text="echo")
        request_id = str(uuid.uuid4())
        if turn.status >= 400:
            await self._error(send, turn.status, turn.error_type, turn.message)
            return
        if not stream:
            await self.send_json(send, 200, turn.converse(), [("x-amzn-requestid", request_id)])
            return
        frames = [
            event_frame(kind, payload, pad=1 + n % 40)
            for n, (kind, payload) in enumerate(turn.events())
        ]
        if turn.exception_after is not None:
            frames = [*frames[: turn.exception_after], exception_frame(*turn.exception)]
        drop = turn.fail_after is not None
        if turn.fail_after is not None:
            frames = frames[: turn.fail_after]
        if turn.byte_chunk:
            body = b"".join(frames)
            frames = [body[i : i + turn.byte_chunk] for i in range(0, len(body), turn.byte_chunk)]
        await self.send_stream(
            send,
            [
                ("content-type", "application/vnd.amazon.eventstream"),
                ("x-amzn-requestid", request_id),
            ],
            frames,
            fail_after=len(frames) if drop else None,
        )
