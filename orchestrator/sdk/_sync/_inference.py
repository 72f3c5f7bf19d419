# Generated from orchestrator/sdk/_async/_inference.py by scripts/unasync_sdk.py: do not edit.
"""Inference instances, models, embeddings, provider health, and chat: OpenAI's chat
completions and Anthropic's messages, whole or streamed, and OpenAI's Responses API (its
stored responses too)."""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from contextlib import closing
from typing import Any

from orchestrator.sdk import _streams
from orchestrator.sdk._base import Call, SseParser, model_of, streamed
from orchestrator.sdk._requests import (
    chat_body,
    chat_completion_call,
    given,
    message_call,
    message_count_call,
    seg,
)
from orchestrator.sdk._sync._core import SyncCore
from orchestrator.wire import (
    ChatCompletion,
    ChatCompletionChunk,
    EmbeddingList,
    InstanceDetail,
    InstanceList,
    InstancesStopped,
    InstanceState,
    Message,
    MessageStreamEvent,
    MessageTokenCount,
    Model,
    ModelList,
    ModelResponse,
    ModelsDiscovered,
    ProvidersStatus,
    ProviderStatusDetail,
    ResponseDeleted,
    ResponseItemList,
)

__all__ = ["SyncInference"]


class SyncInference(SyncCore):
    def instances(self) -> InstanceList:
        return self._send(Call("GET", "/inference", model_of(InstanceList)))

    def start_instance(
        self,
        model: str,
        *,
        gpu_layers: int | None = None,
        ctx_size: int | None = None,
        threads: int | None = None,
    ) -> InstanceState:
        body = given(model=model, gpu_layers=gpu_layers, ctx_size=ctx_size, threads=threads)
        return self._send(Call("POST", "/inference", model_of(InstanceState), body=body))

    def instance(self, instance_id: str) -> InstanceDetail:
        path = f"/inference/{seg(instance_id)}"
        return self._send(Call("GET", path, model_of(InstanceDetail)))

    def stop_instance(self, instance_id: str) -> InstanceState:
        body = {"id": instance_id}
        return self._send(Call("POST", "/stop", model_of(InstanceState), body=body))

    def stop_all_instances(self) -> InstancesStopped:
        return self._send(Call("POST", "/stop-all", model_of(InstancesStopped)))

    def models(self) -> ModelList:
        return self._send(Call("GET", "/models", model_of(ModelList)))

    def model(self, model_id: str) -> Model:
        """One model in OpenAI's shape; 404 model_not_found when unknown."""
        return self._send(Call("GET", f"/models/{seg(model_id)}", model_of(Model)))

    def discover_models(self) -> ModelsDiscovered:
        """Admin: scan for local models again."""
        return self._send(Call("POST", "/discover", model_of(ModelsDiscovered)))

    def embeddings(
        self,
        input: str | Sequence[str],
        *,
        model: str,
        encoding_format: str | None = None,
        dimensions: int | None = None,
    ) -> EmbeddingList:
        """POST /embeddings (OpenAI's shape): `model` is `local` (all-MiniLM-L6-v2) or a
        provider's embedding model."""
        body: dict[str, Any] = {
            "model": model,
            "input": input if isinstance(input, str) else list(input),
        }
        body |= given(encoding_format=encoding_format, dimensions=dimensions)
        return self._send(Call("POST", "/embeddings", model_of(EmbeddingList), body=body))

    def providers_health(self) -> ProvidersStatus:
        return self._send(Call("GET", "/providers/health", model_of(ProvidersStatus)))

    def provider_health(self, provider: str) -> ProviderStatusDetail:
        path = f"/providers/health/{seg(provider)}"
        return self._send(Call("GET", path, model_of(ProviderStatusDetail)))

    # --- chat ------------------------------------------------------------------------------

    def chat_completion(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> ChatCompletion:
        """POST /chat/completions. Fields not named here go in `extra_body`, as in
        openai-python; `chat_completion_stream` streams."""
        body = chat_body(model, messages, max_tokens, temperature, tools, extra_body, False)
        return self._send(chat_completion_call(body))

    def chat_completion_stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Generator[ChatCompletionChunk, None]:
        """POST /chat/completions with `stream: true`: the chunks, up to `[DONE]`."""
        body = chat_body(model, messages, max_tokens, temperature, tools, extra_body, True)
        with closing(self._sse(streamed(chat_completion_call(body)), SseParser())) as frames:
            for frame in frames:
                chunk = _streams.chat_chunk(frame)
                if chunk is None:
                    return
                yield chunk

    def message(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Message:
        """POST /messages (Anthropic's shape; `system` etc. go in `extra_body`)."""
        body = chat_body(model, messages, max_tokens, temperature, tools, extra_body, False)
        return self._send(message_call(body))

    def count_message_tokens(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> MessageTokenCount:
        """POST /messages/count_tokens (Anthropic's shape; `system`, `tools` in `extra_body`)."""
        body = {**(extra_body or {}), "messages": [dict(m) for m in messages], **given(model=model)}
        return self._send(message_count_call(body))

    def message_stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Generator[MessageStreamEvent, None]:
        """POST /messages with `stream: true`: message_start ... message_stop."""
        body = chat_body(model, messages, max_tokens, temperature, tools, extra_body, True)
        with closing(self._sse(streamed(message_call(body)), SseParser())) as frames:
            for frame in frames:
                event = _streams.message_event(frame)
                if event is not None:
                    yield event

    # --- responses (OpenAI's Responses API) ------------------------------------------------

    def create_response(
        self,
        input: str | Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        instructions: str | None = None,
        previous_response_id: str | None = None,
        store: bool | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> ModelResponse:
        """POST /responses, answered whole. Fields not named here go in `extra_body`; to
        stream, use the official `openai` SDK (`client.responses.stream`)."""
        body: dict[str, Any] = {
            **(extra_body or {}),
            "input": input if isinstance(input, str) else [dict(i) for i in input],
        }
        body.update(
            given(
                model=model,
                instructions=instructions,
                previous_response_id=previous_response_id,
                store=store,
                tools=None if tools is None else [dict(t) for t in tools],
            )
        )
        return self._send(Call("POST", "/responses", model_of(ModelResponse), body=body))

    def response(self, response_id: str) -> ModelResponse:
        """GET /responses/{id}: a stored response of yours."""
        path = f"/responses/{seg(response_id)}"
        return self._send(Call("GET", path, model_of(ModelResponse)))

    def delete_response(self, response_id: str) -> ResponseDeleted:
        path = f"/responses/{seg(response_id)}"
        return self._send(Call("DELETE", path, model_of(ResponseDeleted)))

    def response_input_items(
        self,
        response_id: str,
        *,
        limit: int | None = None,
        order: str | None = None,
        after: str | None = None,
        before: str | None = None,
    ) -> ResponseItemList:
        """GET /responses/{id}/input_items: one page (`order` desc by default, OpenAI's)."""
        path = f"/responses/{seg(response_id)}/input_items"
        params = given(limit=limit, order=order, after=after, before=before)
        return self._send(Call("GET", path, model_of(ResponseItemList), params=params))
