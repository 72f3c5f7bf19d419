"""The SDK against the app's OpenAPI document: every route has an SDK method (and every
SDK method a route), each method's result model is the route's own response model (one
definition, orchestrator.wire) and matches its schema (same fields, nothing required that the
server may omit, same JSON types, recursively), and its parameters cover the route's body and
query fields. A route or field added to the server without the SDK fails here."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

import pytest
from fastapi import FastAPI

from orchestrator import wire
from orchestrator.config import Settings
from orchestrator.sdk import ApiModel, AsyncClient, Client

# route -> the Client (and AsyncClient) method that calls it.
ROUTES: dict[tuple[str, str], str] = {
    ("GET", "/tools"): "tools",
    ("GET", "/mcp/servers"): "mcp_servers",
    ("POST", "/mcp/servers"): "create_mcp_server",
    ("GET", "/mcp/servers/{server_id}"): "mcp_server",
    ("PUT", "/mcp/servers/{server_id}"): "update_mcp_server",
    ("DELETE", "/mcp/servers/{server_id}"): "delete_mcp_server",
    ("POST", "/mcp/servers/{server_id}/refresh"): "refresh_mcp_server",
    ("GET", "/tools/http"): "http_tools",
    ("POST", "/tools/http"): "create_http_tool",
    ("GET", "/tools/http/{tool_id}"): "http_tool",
    ("PUT", "/tools/http/{tool_id}"): "update_http_tool",
    ("DELETE", "/tools/http/{tool_id}"): "delete_http_tool",
    ("GET", "/tools/policy"): "tool_policy",
    ("PUT", "/tools/policy"): "set_tool_policy",
    ("GET", "/health"): "health",
    ("GET", "/ready"): "ready",
    ("GET", "/metrics"): "metrics",
    ("GET", "/slo"): "slo",
    ("GET", "/whoami"): "whoami",
    ("POST", "/tokens"): "create_token",
    ("DELETE", "/tokens/{prefix}"): "revoke_token",
    ("POST", "/workflows"): "create_workflow",
    ("GET", "/workflows"): "workflows",
    ("GET", "/workflows/templates"): "templates",
    ("POST", "/workflows/templates"): "save_template",
    ("GET", "/workflows/{workflow_id}"): "workflow",
    ("DELETE", "/workflows/{workflow_id}"): "delete_workflow",
    ("POST", "/workflows/{workflow_id}/cancel"): "cancel_workflow",
    ("GET", "/interventions"): "interventions",
    ("GET", "/interventions/{intervention_id}"): "intervention",
    ("POST", "/interventions/{intervention_id}/approve"): "approve_intervention",
    ("POST", "/interventions/{intervention_id}/reject"): "reject_intervention",
    ("GET", "/teams/{team_id}"): "team",
    ("POST", "/workflows/{workflow_id}/steps/{step}/retry"): "retry_step",
    ("POST", "/workflows/{workflow_id}/steps/{step}/skip"): "skip_step",
    ("POST", "/workflows/{workflow_id}/resume"): "resume_workflow",
    ("POST", "/workflows/{workflow_id}/rerun"): "rerun_workflow",
    ("GET", "/inference"): "instances",
    ("POST", "/inference"): "start_instance",
    ("GET", "/inference/{instance_id}"): "instance",
    ("POST", "/stop"): "stop_instance",
    ("POST", "/stop-all"): "stop_all_instances",
    ("GET", "/models"): "models",
    ("GET", "/models/{model_id}"): "model",
    ("POST", "/embeddings"): "embeddings",
    ("POST", "/discover"): "discover_models",
    ("POST", "/chat/completions"): "chat_completion",
    ("POST", "/messages"): "message",
    ("POST", "/responses"): "create_response",
    ("GET", "/responses/{response_id}"): "response",
    ("DELETE", "/responses/{response_id}"): "delete_response",
    ("GET", "/responses/{response_id}/input_items"): "response_input_items",
    ("POST", "/messages/count_tokens"): "count_message_tokens",
    ("GET", "/providers/health"): "providers_health",
    ("GET", "/providers/health/{provider}"): "provider_health",
    ("GET", "/events"): "events",
    ("GET", "/sync-events"): "sync_events",
    ("POST", "/schedules"): "create_schedule",
    ("POST", "/schedules/preview"): "preview_schedule",
    ("GET", "/schedules"): "schedules",
    ("GET", "/schedules/{job_id}"): "schedule",
    ("DELETE", "/schedules/{job_id}"): "delete_schedule",
    ("POST", "/schedules/{job_id}/pause"): "pause_schedule",
    ("POST", "/schedules/{job_id}/unpause"): "unpause_schedule",
    ("POST", "/schedules/{job_id}/run"): "run_schedule",
    ("GET", "/channels"): "channels",
    ("POST", "/channels"): "create_channel",
    ("GET", "/channels/{channel_id}"): "channel",
    ("PUT", "/channels/{channel_id}"): "update_channel",
    ("DELETE", "/channels/{channel_id}"): "delete_channel",
    ("POST", "/channels/webhook/{token}"): "channel_webhook",
    ("GET", "/marketplace/browse"): "browse_skills",
    ("GET", "/marketplace/search"): "search_skills",
    ("GET", "/marketplace/detail/{name}"): "skill",
    ("POST", "/marketplace/publish"): "publish_skill",
    ("DELETE", "/marketplace/delete/{name}"): "delete_skill",
    ("POST", "/marketplace/report/{name}"): "report_skill",
    ("GET", "/marketplace/reports"): "skill_reports",
    ("POST", "/marketplace/dismiss/{name}"): "dismiss_reports",
    ("GET", "/memory/stats"): "memory_stats",
    ("POST", "/memory/decay"): "memory_decay",
    ("POST", "/memory/share"): "memory_share",
    ("POST", "/memory/{agent_id}/vector-search"): "memory_vector_search",
    ("POST", "/memory/{agent_id}/store"): "memory_store",
    ("GET", "/memory/{agent_id}/search"): "memory_search",
    ("GET", "/memory/{agent_id}/list"): "memory_list",
    ("GET", "/memory/{agent_id}/reflections"): "memory_reflections",
    ("DELETE", "/memory/{agent_id}/clear"): "memory_clear",
    ("GET", "/memory/{agent_id}/{key}"): "memory_get",
    ("DELETE", "/memory/{agent_id}/{key}"): "memory_delete",
    ("POST", "/memory/{agent_id}/{key}/pin"): "memory_pin",
    ("POST", "/workspace/read"): "read_file",
    ("POST", "/workspace/write"): "write_file",
    ("POST", "/workspace/edit"): "edit_file",
    ("POST", "/workspace/search"): "search_files",
    ("GET", "/workspace/list"): "list_files",
}

# Public methods that are not one route each: iterators over a paged route, streaming
# variants of a route above, and the client's own lifetime.
HELPERS = {
    "iter_workflows": "workflows",
    "iter_interventions": "interventions",
    "iter_schedules": "schedules",
    "iter_events": "events",
    "iter_skills": "browse_skills",
    "iter_skill_reports": "skill_reports",
    "iter_memory": "memory_list",
    "chat_completion_stream": "chat_completion",
    "message_stream": "message",
}
LIFETIME = {"close", "aclose", "max_retries", "in_cluster"}  # in_cluster: a constructor

# Routes whose answer the server does not declare (a plain dict, text or a stream): the SDK
# model is checked against real answers in tests/integration/test_sdk_parts.py instead.
UNDECLARED = {
    ("GET", "/ready"),
    ("GET", "/metrics"),
    ("GET", "/inference"),
    ("GET", "/inference/{instance_id}"),
    ("POST", "/chat/completions"),
    ("POST", "/messages"),
    ("POST", "/responses"),
    ("GET", "/responses/{response_id}"),
    ("DELETE", "/responses/{response_id}"),
    ("GET", "/responses/{response_id}/input_items"),
    ("POST", "/messages/count_tokens"),
    ("GET", "/providers/health"),
    ("GET", "/providers/health/{provider}"),
    ("GET", "/sync-events"),
}

# SDK parameter names that differ from the wire's.
RENAMES = {
    "from": "source",
    "to": "target",
    "query": "pattern",
    "id": "instance_id",
    "Idempotency-Key": "idempotency_key",
}
# Query parameters the SDK sets itself or leaves to another method.
NOT_ARGUMENTS = {
    ("GET", "/events"): {"type", "last_event_id", "Last-Event-ID"},  # `types`; SSE in sync_events
    ("GET", "/sync-events"): {"type", "Last-Event-ID"},
    ("POST", "/marketplace/report/{name}"): set(),
}


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    from deployments.api import create_app

    settings = Settings.load(
        environ={},
        database_url="postgresql://127.0.0.1:1/unused",
        redis_url="redis://127.0.0.1:1",
        admin_token="orch_" + "t" * 40,
    )
    app: FastAPI = create_app(settings)
    return app.openapi()


def routes_of(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path, ops in doc["paths"].items():
        assert path.startswith("/api/v1/"), path
        for method, op in ops.items():
            found[(method.upper(), path.removeprefix("/api/v1"))] = op
    return found


def public_methods(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n, None))}


def test_every_route_has_an_sdk_method_and_every_method_a_route(openapi: dict[str, Any]) -> None:
    routes = set(routes_of(openapi))
    assert sorted(routes - set(ROUTES)) == [], "routes without an SDK method"
    assert sorted(set(ROUTES) - routes) == [], "SDK methods of routes the app does not have"
    for cls in (Client, AsyncClient):
        methods = public_methods(cls) - LIFETIME
        named = set(ROUTES.values()) | set(HELPERS)
        assert sorted(named - methods) == [], f"{cls.__name__} lacks these"
        assert sorted(methods - named) == [], f"{cls.__name__} methods of no route"


def test_sync_and_async_clients_have_the_same_signatures() -> None:
    for name in sorted(set(ROUTES.values()) | set(HELPERS)):
        sync, async_ = getattr(Client, name), getattr(AsyncClient, name)
        assert inspect.signature(sync).parameters == inspect.signature(async_).parameters, name


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _variants(doc: dict[str, Any], schema: dict[str, Any]) -> list[dict[str, Any]]:
    schema = _resolve(doc, schema)
    if "anyOf" in schema:
        return [v for s in schema["anyOf"] for v in _variants(doc, s)]
    return [schema]


def _strip_none(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (float, int),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict, ApiModel),
}


def _python_type(annotation: Any) -> type:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return type(typing.get_args(annotation)[0])
    if origin is not None:
        return origin if isinstance(origin, type) else object
    return annotation if isinstance(annotation, type) else object


def compare(
    doc: dict[str, Any],
    cls: type[ApiModel],
    schema: dict[str, Any],
    where: str,
    complete: bool = True,
) -> list[str]:
    """Why `cls` does not describe `schema` (empty: it does). `complete=False`: `cls` may
    leave out properties of the schema (OpenAI's, of which we fill a subset)."""
    schema = _resolve(doc, schema)
    props: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    open_ = schema.get("additionalProperties") is True
    problems = []
    # By the name on the wire: a field's alias where it has one (a team mail's `from`).
    fields = {info.alias or name: info for name, info in cls.model_fields.items()}
    for name in props.keys() - fields.keys() if complete else ():
        problems.append(f"{where}.{name}: the server sends it, {cls.__name__} lacks it")
    for name, info in fields.items():
        if name not in props:
            if not open_:
                problems.append(f"{where}.{name}: in {cls.__name__}, not in the server's schema")
            continue
        if info.is_required() and name not in required:
            problems.append(f"{where}.{name}: required in {cls.__name__}, the server may omit it")
        wire = [v for v in _variants(doc, props[name]) if v.get("type") != "null"]
        ours = _strip_none(info.annotation)
        if not wire or all("type" not in v and "properties" not in v for v in wire):
            continue  # Any on the server
        for annotation in ours:
            problems += _compare_value(doc, annotation, wire, f"{where}.{name}", complete)
    return problems


def _compare_value(
    doc: dict[str, Any],
    annotation: Any,
    wire: list[dict[str, Any]],
    where: str,
    complete: bool = True,
) -> list[str]:
    py = _python_type(annotation)
    kinds = {v.get("type", "object") for v in wire}
    if not any(issubclass(py, JSON_TYPES[k]) for k in kinds if k in JSON_TYPES):
        return [f"{where}: {annotation} in the SDK, {sorted(kinds)} on the wire"]
    if isinstance(annotation, type) and issubclass(annotation, ApiModel):
        objects = [v for v in wire if "properties" in v]
        return compare(doc, annotation, objects[0], where, complete) if objects else []
    args = typing.get_args(annotation)
    if py is list and args:
        items = [_variants(doc, v.get("items", {})) for v in wire if v.get("type") == "array"]
        inner = [i for group in items for i in group if i.get("type") != "null"]
        if inner and any("type" in i or "properties" in i for i in inner):
            return _compare_value(doc, args[0], inner, where + "[]", complete)
    if py is dict and len(args) == 2:
        values = [
            v["additionalProperties"]
            for v in wire
            if isinstance(v.get("additionalProperties"), dict)
        ]
        inner = [i for v in values for i in _variants(doc, v)]
        if inner:
            return _compare_value(doc, args[1], inner, where + "{}", complete)
    return []


def _result_model(name: str) -> Any:
    return typing.get_type_hints(getattr(Client, name))["return"]


def test_result_models_match_the_response_schemas(openapi: dict[str, Any]) -> None:
    problems = []
    undeclared = set()
    for route, op in routes_of(openapi).items():
        answer = op["responses"].get("200") or op["responses"].get("201") or {}
        content = answer.get("content", {})
        schema = content.get("application/json", {}).get("schema", {})
        if "$ref" not in schema:
            undeclared.add(route)
            continue
        model = _result_model(ROUTES[route])
        assert isinstance(model, type) and issubclass(model, ApiModel), route
        # One definition: the route answers with the wire model the SDK reads (or, for a
        # job's detail, a subclass of it that requires the detail-view fields).
        declared = getattr(wire, schema["$ref"].rsplit("/", 1)[1])
        assert issubclass(declared, model), (route, declared, model)
        problems += compare(openapi, model, schema, f"{route[0]} {route[1]}")
    assert problems == []
    # A route that gains a response model must be checked here: take it off UNDECLARED.
    assert undeclared == UNDECLARED


def test_arguments_cover_the_request_fields(openapi: dict[str, Any]) -> None:
    missing = []
    for route, op in routes_of(openapi).items():
        params = set(inspect.signature(getattr(Client, ROUTES[route])).parameters) - {"self"}
        wanted = {p["name"] for p in op.get("parameters", [])}
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {})
        variants = [v for v in _variants(openapi, body.get("schema", {})) if "properties" in v]
        if variants:
            wanted |= set(variants[0]["properties"])
        elif body:
            # A free-form body (chat, messages) is the method's messages + extra_body.
            chat = route[1] in ("/chat/completions", "/messages", "/messages/count_tokens")
            wanted = wanted | ({"messages"} if chat else set())
        wanted -= NOT_ARGUMENTS.get(route, set())
        if route == ("POST", "/channels/webhook/{token}"):
            wanted.add("payload")
        lacking = {RENAMES.get(w, w) for w in wanted} - params
        if lacking:
            missing.append(f"{route}: {sorted(lacking)}")
    assert missing == []


def test_models_of_undeclared_answers_match_the_server_wire_functions() -> None:
    """GET /inference and /models items are built by the domain's `wire()`: the SDK's
    models carry exactly those keys."""
    from orchestrator.inference._instances import InstanceRecord, InstanceState
    from orchestrator.inference._models import ModelEntry
    from orchestrator.sdk import Instance, InstanceDetail, ModelInfo

    record = InstanceRecord(
        id="inf-1",
        model_name="m",
        model_path="/m.gguf",
        state=InstanceState.RUNNING,
        ctx_size=4096,
        gpu_layers=0,
        threads=2,
        user_uuid="ann",
        host="127.0.0.1",
        port=9000,
        pid=42,
        error=None,
        created_at=1,
        updated_at=2,
    )
    wire = record.wire()
    assert set(Instance.model_fields) == set(wire)
    assert Instance.model_validate(wire, extra="allow").model_extra == {}  # as the SDK reads
    assert set(InstanceDetail.model_fields) == set(wire) | {"ok"}
    entry = ModelEntry(name="m", status="available", provider="local", ctx_size=4096)
    assert ModelInfo.model_validate(entry.wire(), extra="allow").model_extra == {}
    assert set(ModelInfo.model_fields) == set(entry.wire())


def openai_reference() -> dict[str, Any]:
    """OpenAI's published schemas (the subset the issue names; MIT, LICENSE beside it)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for candidate in (
        root / "tests" / "reference" / "openai-openapi-subset.json",
        root.parent / "shared" / "reference" / "openai-openapi-subset.json",
    ):
        if candidate.exists():
            doc: dict[str, Any] = json.loads(candidate.read_text())
            return doc
    raise AssertionError("openai-openapi-subset.json not found")


def test_openai_shaped_models_are_subsets_of_openai_schemas() -> None:
    """The SDK's chat models name only OpenAI's fields, with OpenAI's types, and require
    nothing OpenAI does not."""
    from orchestrator.sdk import ChatCompletion, ChatCompletionChunk, ResponseItemList

    doc = openai_reference()
    pairs = {
        ChatCompletion: "CreateChatCompletionResponse",
        ChatCompletionChunk: "CreateChatCompletionStreamResponse",
        # (ModelResponse: OpenAI's Response is an allOf, which `compare` does not read; the
        # bodies themselves are validated against it in tests/integration/test_responses_*.)
        ResponseItemList: "ResponseItemList",
    }
    problems = []
    for cls, name in pairs.items():
        ref = {"$ref": f"#/components/schemas/{name}"}
        problems += compare(doc, cls, ref, name, complete=False)
    assert problems == []
