"""SPEC part 2, "Resources and their fields": every field of every resource table, with its
type and the notes that can be observed (formats, value sets, units), read from the running
service. Each case's id names the table row it checks."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.integration.spec._kit import (
    ADMIN,
    LOCAL_MODEL,
    MODEL,
    TG_TOKEN,
    Spec,
    create_workflow,
    events,
    finished,
    is_type,
    until,
)

# The hosted model's window is known to no table nor metadata: without `model_ctx_sizes`
# it lists `ctx_size: null` (the deliberate difference of docs/api/inference.md); the
# setting makes it the spec's integer.
MODEL_WINDOW = 32_768


@pytest.fixture(scope="module")
def spec_overrides() -> dict[str, Any]:
    return {"model_ctx_sizes": {MODEL: MODEL_WINDOW}}


WORKFLOW_STATES = {"pending", "running", "completed", "failed", "cancelled"}
STEP_STATES = {"pending", "running", "completed", "failed", "skipped"}
INSTANCE_STATES = {"stopped", "starting", "ready", "running", "failed"}


@pytest.fixture(scope="module")
async def seen(spec: Spec) -> AsyncIterator[dict[str, Any]]:
    """One of each resource, made through the API by one user, as the service shows it."""
    c = spec.c
    ann = await spec.user("p2-ann")
    out: dict[str, Any] = {}
    # Workflow with every step input field of the Step table.
    wid = await create_workflow(
        c,
        ann,
        name="p2-flow",
        steps=[
            {"name": "first", "prompt": "[answer HIGH]", "mode": "explore", "timeout": 20},
            {
                "name": "route",
                "type": "branch",
                "conditions": {
                    "hi": {"match": "{{first.result}}", "pattern": "HIGH", "then": "tools"},
                    "else": {"then": "never"},
                },
            },
            {"name": "never", "prompt": "x", "mode": "plan"},
            {"name": "tools", "prompt": "go", "tools": ["calculate"], "mode": "build"},
            {"name": "cond", "prompt": "y", "condition": '{{first.result}} contains "LOW"'},
        ],
    )
    out["workflow"] = await finished(c, ann, wid)
    out["workflow_list"] = (await c.get("/workflows", headers=ann)).json()
    out["events"] = await events(c, wid, ann)
    # Scheduled jobs (admin): one of each schedule type; the cron one run once.
    made = {}
    for kind, value in (("cron", "*/5 * * * *"), ("every", 60_000), ("at", None)):
        at = int(time.time() * 1000) + 3_600_000
        body = {
            "name": f"p2-{kind}",
            "prompt": "[answer ok]",
            "model": MODEL,
            kind: value if value else at,
        }
        r = await c.post("/schedules", headers=ADMIN, json=body)
        assert r.status_code == 200, r.text
        made[kind] = r.json()["id"]
    r = await c.post(f"/schedules/{made['cron']}/run", headers=ADMIN)
    assert r.status_code == 200, r.text

    async def ran() -> Any:
        job = (await c.get(f"/schedules/{made['cron']}", headers=ADMIN)).json()
        return job if job.get("last_result") else None

    out["job_cron"] = await until(ran)
    out["job_every"] = (await c.get(f"/schedules/{made['every']}", headers=ADMIN)).json()
    out["job_at"] = (await c.get(f"/schedules/{made['at']}", headers=ADMIN)).json()
    out["job_list"] = (await c.get("/schedules", headers=ADMIN)).json()
    # Channel (Telegram-style: a secret and a non-secret config field).
    r = await c.post(
        "/channels",
        headers=ann,
        json={
            "type": "telegram",
            "name": "p2-tg",
            "config": {"bot_token": TG_TOKEN, "chat_ids": ["42"]},
        },
    )
    assert r.status_code == 200, r.text
    out["channels"] = (await c.get("/channels", headers=ann)).json()
    # Skill.
    r = await c.post(
        "/marketplace/publish",
        headers=ann,
        json={"name": "p2-skill", "description": "d", "tags": ["x", "y"], "body": "B" * 10},
    )
    assert r.status_code == 200, r.text
    out["browse"] = (await c.get("/marketplace/browse", headers=ann)).json()
    out["detail"] = (await c.get("/marketplace/detail/p2-skill", headers=ann)).json()
    # Memory entry.
    r = await c.post(
        "/memory/p2-agent/store", headers=ann, json={"key": "k", "value": "v", "ttl": 0}
    )
    assert r.status_code == 200, r.text
    out["memory"] = (await c.get("/memory/p2-agent/k", headers=ann)).json()
    out["memory_list"] = (await c.get("/memory/p2-agent/list", headers=ann)).json()
    # Workspace entries.
    r = await c.post("/workspace/write", headers=ann, json={"path": "d/f.txt", "content": "12345"})
    assert r.status_code == 200, r.text
    out["ws_list"] = (
        await c.get("/workspace/list", headers=ann, params={"path": "", "recursive": "true"})
    ).json()
    out["ws_search"] = (
        await c.post("/workspace/search", headers=ann, json={"query": "**/*.txt", "max_results": 5})
    ).json()
    # Models and an inference instance.
    r = await c.post("/discover", headers=ADMIN)
    assert r.status_code == 200, r.text
    out["models"] = (await c.get("/models", headers=ADMIN)).json()
    r = await c.post("/inference", headers=ADMIN, json={"model": LOCAL_MODEL})
    assert r.status_code == 200, r.text
    iid = r.json()["id"]
    out["instance_created"] = r.json()

    async def failed() -> Any:
        got = (await c.get(f"/inference/{iid}", headers=ADMIN)).json()
        return got if got["state"] == "failed" else None

    out["instance"] = await until(failed)
    yield out


# --- Workflow -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        pytest.param("id", "string", id="SPEC part 2 Workflow: id string"),
        pytest.param("name", "string", id="SPEC part 2 Workflow: name string"),
        pytest.param("status", "string", id="SPEC part 2 Workflow: status string"),
        pytest.param("steps", "array", id="SPEC part 2 Workflow: steps array of step"),
    ],
)
def test_workflow_field_types(seen: dict[str, Any], field: str, kind: str) -> None:
    assert is_type(seen["workflow"][field], kind), seen["workflow"]


def test_workflow_id_format(seen: dict[str, Any]) -> None:
    """SPEC part 2 Workflow: id "Format `wf-<number>`"."""
    assert re.fullmatch(r"wf-\d+", seen["workflow"]["id"])
    assert seen["workflow"]["name"] == "p2-flow"


def test_workflow_status_values(seen: dict[str, Any]) -> None:
    """SPEC part 2 Workflow: status "One of pending, running, completed, failed, cancelled"
    (in the detail and in the list)."""
    assert seen["workflow"]["status"] == "completed"
    listed = seen["workflow_list"]["data"]
    assert listed and all(w["status"] in WORKFLOW_STATES for w in listed)


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        pytest.param("name", "string", id="SPEC part 2 Step: name string"),
        pytest.param("status", "string", id="SPEC part 2 Step: status string (output)"),
    ],
)
def test_step_output_field_types(seen: dict[str, Any], field: str, kind: str) -> None:
    for step in seen["workflow"]["steps"]:
        assert is_type(step[field], kind), step


def test_step_names_kept_in_order(seen: dict[str, Any]) -> None:
    """SPEC part 2 Step: name "Step identifier" (the workflow shows its steps as given)."""
    names = [s["name"] for s in seen["workflow"]["steps"]]
    assert names == ["first", "route", "never", "tools", "cond"]


def test_step_status_values(seen: dict[str, Any]) -> None:
    """SPEC part 2 Step: status "One of pending, running, completed, failed, skipped";
    a branch skips the step it jumps over, a false `condition` skips its step."""
    status = {s["name"]: s["status"] for s in seen["workflow"]["steps"]}
    assert set(status.values()) <= STEP_STATES
    assert status == {
        "first": "completed",
        "route": "completed",
        "never": "skipped",
        "tools": "completed",
        "cond": "skipped",
    }


def test_step_result_once_completed(seen: dict[str, Any]) -> None:
    """SPEC part 2 Step: result string "Present once the step has completed"."""
    for step in seen["workflow"]["steps"]:
        if step["status"] == "completed":
            assert is_type(step["result"], "string"), step
        else:
            assert step.get("result") in (None, ""), step
    assert seen["workflow"]["steps"][0]["result"] == "HIGH"


def test_step_inputs_reach_the_task(spec: Spec, seen: dict[str, Any]) -> None:
    """SPEC part 2 Step: "Each step receives the original prompt, results of previous steps,
    and its own configuration (mode, tools, timeout)"."""
    requests = [r.json for r in spec.llm.chat_requests]
    tools_step = next(r for r in requests if "## Task\ngo" in r["messages"][1]["content"])
    assert [t["function"]["name"] for t in tools_step["tools"]] == ["calculate"]
    opening = tools_step["messages"][1]["content"]
    assert "[answer HIGH]" in opening and "HIGH" in opening
    assert "builder agent" in tools_step["messages"][0]["content"]


MODES = ["build", "plan", "explore", "review", "general", "coordinate"]


@pytest.mark.parametrize("mode", [pytest.param(m, id=f"SPEC part 2 Step: mode {m}") for m in MODES])
async def test_step_modes(spec: Spec, mode: str) -> None:
    """SPEC part 2 Step: mode "Agent mode: build, plan, explore, review, general,
    coordinate": each is taken and its step runs."""
    h = await spec.user("p2-modes")
    wid = await create_workflow(
        spec.c, h, name=f"p2-{mode}", steps=[{"name": "s", "prompt": "[answer M]", "mode": mode}]
    )
    body = await finished(spec.c, h, wid)
    assert body["status"] == "completed" and body["steps"][0]["result"] == "M", body


@pytest.mark.parametrize(
    "step",
    [
        pytest.param({"prompt": "x"}, id="SPEC part 2 Step: name required"),
        pytest.param({"name": "a"}, id="SPEC part 2 Step: prompt required for normal steps"),
        pytest.param(
            {"name": "a", "prompt": "x", "mode": "dance"}, id="SPEC part 2 Step: mode one of six"
        ),
        pytest.param(
            {"name": "a", "type": "branch"}, id="SPEC part 2 Step: conditions for branch steps"
        ),
        pytest.param(
            {"name": "a", "type": "branch", "conditions": {"x": {"match": "{{a.result}}"}}},
            id="SPEC part 2 Step: conditions entry requires then",
        ),
    ],
)
async def test_step_input_refused(spec: Spec, step: dict[str, Any]) -> None:
    h = await spec.user("p2-bad")
    r = await spec.c.post("/workflows", headers=h, json={"name": "bad", "steps": [step]})
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "validation_error" and r.json()["fields"], r.text


async def test_step_timeout(spec: Spec) -> None:
    """SPEC part 2 Step: timeout number "Step timeout in seconds": a step that runs longer
    fails (and so does its workflow)."""
    h = await spec.user("p2-timeout")
    wid = await create_workflow(
        spec.c, h, name="p2-t", steps=[{"name": "slow", "prompt": "[sleep 5]", "timeout": 0.5}]
    )
    body = await finished(spec.c, h, wid)
    assert body["status"] == "failed" and body["steps"][0]["status"] == "failed"


async def test_branch_fallback(spec: Spec) -> None:
    """SPEC part 2 Step: conditions "An entry without `match` acts as the fallback"; `then`
    names the step to run next (the steps jumped over are skipped)."""
    h = await spec.user("p2-branch")
    wid = await create_workflow(
        spec.c,
        h,
        name="p2-b",
        steps=[
            {"name": "first", "prompt": "[answer MEDIUM]"},
            {
                "name": "route",
                "type": "branch",
                "conditions": {
                    "hi": {"match": "{{first.result}}", "pattern": "^HIGH$", "then": "high"},
                    "rest": {"then": "other"},
                },
            },
            {"name": "high", "prompt": "x"},
            {"name": "other", "prompt": "y"},
        ],
    )
    body = await finished(spec.c, h, wid)
    status = {s["name"]: s["status"] for s in body["steps"]}
    assert status == {
        "first": "completed",
        "route": "completed",
        "high": "skipped",
        "other": "completed",
    }


# --- Inference instance and model entry ---------------------------------------------------


def test_instance_fields(seen: dict[str, Any]) -> None:
    """SPEC part 2 Inference instance: id string "Format `inf-<number>`"; state string, one
    of stopped, starting, ready, running, failed."""
    created, got = seen["instance_created"], seen["instance"]
    assert re.fullmatch(r"inf-\d+", created["id"]) and got["id"] == created["id"]
    assert is_type(got["state"], "string") and got["state"] in INSTANCE_STATES
    assert created["state"] == "starting"


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        pytest.param("name", "string", id="SPEC part 2 Model entry: name string"),
        pytest.param("status", "string", id="SPEC part 2 Model entry: status string"),
        pytest.param("provider", "string", id="SPEC part 2 Model entry: provider string"),
        pytest.param("ctx_size", "integer", id="SPEC part 2 Model entry: ctx_size integer"),
    ],
)
def test_model_entry_fields(seen: dict[str, Any], field: str, kind: str) -> None:
    models = seen["models"]["models"]
    names = {m["name"] for m in models}
    assert {MODEL, LOCAL_MODEL} <= names, names
    for entry in models:
        assert is_type(entry[field], kind), entry
    if field == "ctx_size":
        assert next(m for m in models if m["name"] == MODEL)["ctx_size"] == MODEL_WINDOW


# --- Event --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        pytest.param("id", "string", id="SPEC part 2 Event: id string"),
        pytest.param("type", "string", id="SPEC part 2 Event: type string"),
        pytest.param("version", "integer", id="SPEC part 2 Event: version integer"),
        pytest.param("aggregate_id", "string", id="SPEC part 2 Event: aggregate_id string"),
        pytest.param("seq", "integer", id="SPEC part 2 Event: seq integer"),
        pytest.param("timestamp", "unix ms", id="SPEC part 2 Event: timestamp Unix ms"),
        pytest.param("data", "object", id="SPEC part 2 Event: data object"),
    ],
)
def test_event_fields(seen: dict[str, Any], field: str, kind: str) -> None:
    assert seen["events"]
    for event in seen["events"]:
        assert is_type(event[field], kind), event


def test_event_ids_unique_and_seq_monotonic(seen: dict[str, Any]) -> None:
    """SPEC part 2 Event: id "Unique event identifier"; seq "Monotonic sequence number
    within the aggregate"."""
    evs = seen["events"]
    assert len({e["id"] for e in evs}) == len(evs)
    assert [e["seq"] for e in evs] == sorted(e["seq"] for e in evs)
    assert all(e["aggregate_id"] == seen["workflow"]["id"] for e in evs)


# --- Scheduled job ------------------------------------------------------------------------

JOB_FIELDS = [
    ("id", "integer"),
    ("name", "string"),
    ("schedule_type", "string"),
    ("prompt", "string"),
    ("model", "string"),
    ("enabled", "boolean"),
    ("next_run", "unix ms"),
    ("last_run", "unix ms"),
    ("last_result", "string"),
    ("consecutive_errors", "integer"),
    ("user_uuid", "string"),
    ("created_at", "unix ms"),
    ("cron_expr", "string"),
]


@pytest.mark.parametrize(
    ("field", "kind"),
    [pytest.param(f, k, id=f"SPEC part 2 Scheduled job: {f} {k}") for f, k in JOB_FIELDS],
)
def test_job_detail_fields(seen: dict[str, Any], field: str, kind: str) -> None:
    job = seen["job_cron"]
    assert is_type(job[field], kind), job


def test_job_values(seen: dict[str, Any]) -> None:
    """SPEC part 2 Scheduled job: schedule_type "cron, every or at"; cron_expr "Present for
    cron jobs"; interval_ms "Present for every jobs"; last_result "`ok` is one value";
    enabled "False while paused" (true while active); user_uuid "Creator"."""
    cron, ev, at = seen["job_cron"], seen["job_every"], seen["job_at"]
    assert (cron["schedule_type"], ev["schedule_type"], at["schedule_type"]) == (
        "cron",
        "every",
        "at",
    )
    assert cron["cron_expr"] == "*/5 * * * *"
    assert is_type(ev["interval_ms"], "integer") and ev["interval_ms"] == 60_000
    assert cron["last_result"] == "ok" and cron["consecutive_errors"] == 0
    assert cron["enabled"] is True and cron["user_uuid"] == "admin"
    assert cron["model"] == MODEL


DETAIL_ONLY = ["prompt", "model", "last_result", "user_uuid"]


@pytest.mark.parametrize(
    "field",
    [pytest.param(f, id=f"SPEC part 2 Scheduled job: {f} detail view only") for f in DETAIL_ONLY],
)
def test_job_detail_only_fields(seen: dict[str, Any], field: str) -> None:
    items = seen["job_list"]["items"]
    assert items
    for item in items:
        assert field not in item, item


# --- Channel ------------------------------------------------------------------------------


def test_channel_fields(seen: dict[str, Any]) -> None:
    """SPEC part 2 Channel: id string, type string (telegram), name string, status string
    (`active` is one value), config object "Type-specific" (telegram: `bot_token`,
    `chat_ids`), the secret masked and the rest as set (issue 33)."""
    (channel,) = [ch for ch in seen["channels"]["data"] if ch["name"] == "p2-tg"]
    assert is_type(channel["id"], "string") and channel["type"] == "telegram"
    assert channel["status"] == "active" and is_type(channel["config"], "object")
    assert channel["config"]["chat_ids"] == ["42"]
    assert channel["config"]["bot_token"] != TG_TOKEN


# --- Skill --------------------------------------------------------------------------------

SKILL_LISTING = [
    ("name", "string"),
    ("author", "string"),
    ("description", "string"),
    ("tags", "array of string"),
    ("downloads", "integer"),
    ("version", "string"),
]
SKILL_DETAIL = [
    ("name", "string"),
    ("author", "string"),
    ("description", "string"),
    ("tags", "array of string"),
    ("body", "string"),
    ("downloads", "integer"),
    ("created_at", "unix ms"),
]


@pytest.mark.parametrize(
    ("field", "kind"),
    [pytest.param(f, k, id=f"SPEC part 2 Skill (listing): {f} {k}") for f, k in SKILL_LISTING],
)
def test_skill_listing_fields(seen: dict[str, Any], field: str, kind: str) -> None:
    (item,) = [s for s in seen["browse"]["items"] if s["name"] == "p2-skill"]
    assert is_type(item[field], kind), item


@pytest.mark.parametrize(
    ("field", "kind"),
    [pytest.param(f, k, id=f"SPEC part 2 Skill (detail): {f} {k}") for f, k in SKILL_DETAIL],
)
def test_skill_detail_fields(seen: dict[str, Any], field: str, kind: str) -> None:
    assert is_type(seen["detail"][field], kind), seen["detail"]


def test_skill_values(seen: dict[str, Any]) -> None:
    """SPEC part 2 Skill: author "Author user identifier"; body "returned in detail view
    only"; created_at "detail view only"."""
    (item,) = [s for s in seen["browse"]["items"] if s["name"] == "p2-skill"]
    assert item["author"] == "p2-ann" and seen["detail"]["author"] == "p2-ann"
    assert item["tags"] == ["x", "y"] and seen["detail"]["body"] == "B" * 10
    assert "body" not in item and "created_at" not in item


# --- Memory entry -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        pytest.param("key", "string", id="SPEC part 2 Memory entry: key string"),
        pytest.param("value", "string", id="SPEC part 2 Memory entry: value string"),
        pytest.param("created_at", "unix ms", id="SPEC part 2 Memory entry: created_at Unix ms"),
    ],
)
def test_memory_entry_fields(seen: dict[str, Any], field: str, kind: str) -> None:
    assert is_type(seen["memory"][field], kind), seen["memory"]
    for entry in seen["memory_list"]["entries"]:
        assert is_type(entry[field], kind), entry


async def test_memory_ttl_expires(spec: Spec) -> None:
    """SPEC part 2 Memory entry: ttl "Milliseconds; 0 means no expiry. Set at store time."
    An entry with a ttl of 300 ms is gone (410) once that has passed; ttl 0 never expires."""
    h = await spec.user("p2-ttl")
    for key, ttl in (("short", 300), ("forever", 0)):
        r = await spec.c.post(
            "/memory/p2-ttl/store", headers=h, json={"key": key, "value": "v", "ttl": ttl}
        )
        assert r.status_code == 200, r.text

    async def expired() -> bool:
        return (await spec.c.get("/memory/p2-ttl/short", headers=h)).status_code == 410

    await until(expired, 10)
    assert (await spec.c.get("/memory/p2-ttl/forever", headers=h)).status_code == 200


async def test_memory_embedding_array_of_number(spec: Spec) -> None:
    """SPEC part 2 Memory entry: embedding "array of number", "Optional vector"; given at
    store, it is what vector search compares (similarity 1 to itself)."""
    h = await spec.user("p2-vec")
    dim = spec.settings.memory_embedding_dim
    vec = [1.0] + [0.0] * (dim - 1)
    r = await spec.c.post(
        "/memory/p2-vec/store", headers=h, json={"key": "v", "value": "x", "embedding": vec}
    )
    assert r.status_code == 200, r.text
    r = await spec.c.post("/memory/p2-vec/vector-search", headers=h, json={"embedding": vec})
    assert r.status_code == 200, r.text
    (hit,) = r.json()["results"]
    assert hit["key"] == "v" and is_type(hit["similarity"], "number")
    assert hit["similarity"] == pytest.approx(1.0, abs=1e-4)


async def test_memory_pinned_boolean(spec: Spec) -> None:
    """SPEC part 2 Memory entry: pinned boolean."""
    h = await spec.user("p2-pin")
    await spec.c.post("/memory/p2-pin/store", headers=h, json={"key": "k", "value": "v"})
    r = await spec.c.post("/memory/p2-pin/k/pin", headers=h, json={"pinned": True})
    assert r.status_code == 200, r.text
    assert r.json()["pinned"] is True


async def test_memory_user_uuid_owner(spec: Spec) -> None:
    """SPEC part 2 Memory entry: user_uuid "Owner, set at store time": another user does not
    read it (SPEC part 5 item 6), its owner does."""
    own = await spec.user("p2-own")
    other = await spec.user("p2-other")
    await spec.c.post("/memory/p2-own/store", headers=own, json={"key": "k", "value": "v"})
    assert (await spec.c.get("/memory/p2-own/k", headers=own)).status_code == 200
    assert (await spec.c.get("/memory/p2-own/k", headers=other)).status_code == 404


async def test_memory_agent_id(spec: Spec) -> None:
    """SPEC part 2 Memory entry: agent_id "namespace identifier, default `default`, at most
    128 characters"."""
    h = await spec.user("p2-ns")
    ok = await spec.c.post("/memory/default/store", headers=h, json={"key": "p2", "value": "v"})
    assert ok.status_code == 200, ok.text
    assert (await spec.c.get("/memory/default/p2", headers=h)).json()["value"] == "v"
    long_ok = await spec.c.post(
        f"/memory/{'a' * 128}/store", headers=h, json={"key": "k", "value": "v"}
    )
    assert long_ok.status_code == 200, long_ok.text
    too_long = await spec.c.post(
        f"/memory/{'a' * 129}/store", headers=h, json={"key": "k", "value": "v"}
    )
    assert too_long.status_code == 400, too_long.text


async def test_memory_agent_id_default_for_agent_tools(spec: Spec) -> None:
    """SPEC part 2 Memory entry: agent_id "default `default`": an agent's memory tool called
    without one stores in the namespace `default`, as the task's user."""
    h = await spec.user("p2-tool")
    prompt = '[tool memory_store {"key": "p2-tool-key", "value": "from the agent"}]'
    wid = await create_workflow(spec.c, h, name="p2-mem", steps=[{"name": "m", "prompt": prompt}])
    assert (await finished(spec.c, h, wid))["status"] == "completed"
    got = await spec.c.get("/memory/default/p2-tool-key", headers=h)
    assert got.status_code == 200, got.text
    assert got.json()["value"] == "from the agent"


# --- Workspace entries --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "kind"),
    [
        pytest.param("path", "string", id="SPEC part 2 Workspace entry: path string"),
        pytest.param("type", "string", id="SPEC part 2 Workspace entry: type file or directory"),
        pytest.param("size", "integer", id="SPEC part 2 Workspace entry: size integer"),
        pytest.param(
            "modified", "iso8601 utc", id="SPEC part 2 Workspace entry: modified ISO 8601 UTC"
        ),
    ],
)
def test_workspace_entry_fields(seen: dict[str, Any], field: str, kind: str) -> None:
    entries = seen["ws_list"]["entries"]
    assert entries
    for entry in entries:
        assert is_type(entry[field], kind), entry
    for hit in seen["ws_search"]["results"]:
        if field != "type":
            assert is_type(hit[field], kind), hit


def test_workspace_entry_values(seen: dict[str, Any]) -> None:
    """SPEC part 2 Workspace entries: path "relative to workspace root", type "file or
    directory", size in bytes."""
    entries = {e["path"]: e for e in seen["ws_list"]["entries"]}
    assert entries["d"]["type"] == "directory"
    assert entries["d/f.txt"]["type"] == "file" and entries["d/f.txt"]["size"] == 5
