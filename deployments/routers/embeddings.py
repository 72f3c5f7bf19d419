"""POST /embeddings in OpenAI's shape (issue 18): the local embedder (all-MiniLM-L6-v2, the
one memory uses with `embedder: local`) under the names in LOCAL_MODELS, and any other model
through the provider serving it, in that provider's wire format (`Gateway.embed`, the path
`embedder: provider:<model>` takes for memory). A provider's 400/404 is ours with its
message; its failures are 502/503/504 as for chat. Auth and rate limits apply as for every
route; each call is an `inference.complete` record (`finish_reason: embeddings`).

A request carries at most `embedding_max_inputs` inputs and `embedding_max_request_tokens`
tokens for the local model (issue 29: one request of 2,000 long inputs OOM-killed the
replica), `embedding_provider_max_request_tokens` (OpenAI's 300,000) for a provider's: over
either, a 400 naming the setting, before any embedding is made. The local model reads at most 256
word pieces of an input and runs in bounded batches, queued with memory's (`_embed.py`), the
caller's tenant taking its turn with the others batch by batch (issue 29)."""

from __future__ import annotations

import base64
import struct
import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request

from deployments.deps import Config, CurrentUser, InferenceRecords, ModelGateway
from orchestrator import wire
from orchestrator.config import Settings
from orchestrator.errors import BadRequest, OrchestratorError
from orchestrator.memory import ProviderEmbedder
from orchestrator.memory._embed import LOCAL_DIM, LOCAL_MODELS, EmbeddingLimits, local_embedder
from orchestrator.providers import Gateway

router = APIRouter(tags=["inference"])


def _inputs(body: dict[str, Any], limits: EmbeddingLimits) -> list[str]:
    value = body.get("input")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise BadRequest(
            "input must be a non-empty string or array of strings",
            extra={"fields": [{"field": "input", "message": "required"}]},
        )
    limits.check_inputs(len(value))
    if any(isinstance(v, int) or isinstance(v, list) for v in value):
        raise BadRequest(
            "input as token arrays is not supported: send strings",
            extra={"fields": [{"field": "input", "message": "token arrays"}]},
        )
    if not all(isinstance(v, str) and v for v in value):
        raise BadRequest(
            "input: every item must be a non-empty string",
            extra={"fields": [{"field": "input", "message": "type"}]},
        )
    return value


def _encoding(body: dict[str, Any]) -> str:
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise BadRequest(
            "encoding_format must be float or base64",
            extra={"fields": [{"field": "encoding_format", "message": "enum"}]},
        )
    return str(encoding)


def _dimensions(body: dict[str, Any]) -> int | None:
    dimensions = body.get("dimensions")
    if dimensions is None:
        return None
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
        raise BadRequest(
            "dimensions must be a positive integer",
            extra={"fields": [{"field": "dimensions", "message": "type"}]},
        )
    return dimensions


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    # OpenAI's base64: the little-endian float32 bytes.
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


async def _embed(
    settings: Settings,
    gateway: Gateway,
    model: str,
    texts: list[str],
    dimensions: int | None,
    limits: EmbeddingLimits,
    user: str,
) -> tuple[list[list[float]], int, str]:
    """(vectors, prompt tokens, provider); over `limits`, a 400 before any is made."""
    if model in LOCAL_MODELS:
        if dimensions is not None and dimensions != LOCAL_DIM:
            raise BadRequest(
                f"dimensions: {model} makes {LOCAL_DIM}-dimensional vectors only",
                extra={"fields": [{"field": "dimensions", "message": "unsupported"}]},
            )
        local = local_embedder(settings.embedder_threads)
        vectors, tokens = await local.embed_counted(texts, limits, user=user)
        return vectors, tokens, "local"
    embedder = ProviderEmbedder(gateway, model, EmbeddingLimits.for_provider(settings))
    vectors, tokens, provider = await embedder.embed_counted(texts, dimensions)
    if dimensions is not None and any(len(v) != dimensions for v in vectors):
        raise BadRequest(
            f"dimensions: {model} does not shorten its vectors to {dimensions}",
            extra={"fields": [{"field": "dimensions", "message": "unsupported"}]},
        )
    return vectors, tokens, provider


@router.post("/embeddings", response_model=wire.EmbeddingList)
async def embeddings(
    body: Annotated[dict[str, Any], Body()],
    request: Request,
    settings: Config,
    gateway: ModelGateway,
    inference_log: InferenceRecords,
    principal: CurrentUser,
) -> wire.EmbeddingList:
    """OpenAI's CreateEmbeddingResponse: one `embedding` per input, in order."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest(
            "model is required", extra={"fields": [{"field": "model", "message": "required"}]}
        )
    limits = EmbeddingLimits.of(settings)
    texts = _inputs(body, limits)
    encoding = _encoding(body)
    dimensions = _dimensions(body)
    request_id = str(getattr(request.state, "request_id", "") or "")
    started = time.perf_counter()
    inference_log.request(
        request_id=request_id,
        user_uuid=principal.user_uuid,
        model=model,
        stream=False,
        messages=len(texts),
    )
    try:
        vectors, tokens, provider = await _embed(
            settings, gateway, model, texts, dimensions, limits, principal.user_uuid
        )
    except OrchestratorError as exc:
        inference_log.error(
            request_id=request_id,
            user_uuid=principal.user_uuid,
            model=model,
            error=exc.message,
            status_code=exc.status_code,
        )
        raise
    inference_log.complete(
        request_id=request_id,
        user_uuid=principal.user_uuid,
        model=model,
        provider=provider,
        tokens_in=tokens,
        tokens_out=0,
        duration_ms=int((time.perf_counter() - started) * 1000),
        finish_reason="embeddings",
        stream=False,
    )
    return wire.EmbeddingList(
        model=model,
        data=[
            wire.Embedding(index=i, embedding=_encode(v, encoding)) for i, v in enumerate(vectors)
        ],
        usage=wire.EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
    )
