"""The in-cluster Python API on a `ray start` cluster, the service started with
`orchestrator serve --address` (HAProxy in front, so HTTP needs the ingress key): drivers
joined to the cluster call it through the application's deployment handle, not HTTP.

- examples/in_cluster.py (what docs/sdk.md shows) runs a workflow as its token's user;
- a bad token is a 401, another tenant's workflow a 404, and a token's rate limit is one
  budget whether it is spent over HTTP or the handle;
- streams through the handle: `/sync-events` delivers each event while the stream is open,
  resumes from Last-Event-ID, shows only the token's tenant, frees the replica's side when
  the reader leaves (the open-stream gauge) and refuses a revoked token's reconnection; a
  streamed chat completion arrives chunk by chunk.

Every wait of the drivers is bounded (a reader thread and a queue: a handle read has no
timeout of its own), so a stream that stalls fails the test instead of hanging it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import httpx
import pytest

from tests.e2e.drivers import last_json_line
from tests.e2e.test_generations import Cluster, Service, cluster
from tests.e2e.test_serve import ROOT
from tests.e2e.test_workflows import MODEL
from tests.fakes.openai_server import FakeReply

# A loaded machine: a driver joining the cluster and a fresh service's first workflow are slow.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]
__all__ = ["cluster"]  # the module-scoped `ray start` cluster fixture, shared

RATE = 30  # requests per token per minute


@pytest.fixture(scope="module")
def service(cluster: Cluster) -> Iterator[Service]:
    started = Service(
        cluster,
        cluster.root / "in-cluster",
        # Pings every second: a stream reader notices within a second that it may stop.
        settings={"rate_limit_per_minute": RATE, "sse_ping_interval_s": 1},
    )
    started.work.mkdir(exist_ok=True)
    started.start()
    try:
        yield started
    finally:
        started.stop()
        sys.stdout.write((started.work / "serve.log").read_text(errors="replace")[-3000:])


def _issued(service: Service, user: str) -> dict[str, Any]:
    with service.client() as admin:
        made = admin.post("/tokens", json={"user_uuid": user})
        assert made.status_code == 200, made.text
        return dict(made.json())


def _token(service: Service, user: str) -> str:
    return str(_issued(service, user)["token"])


def _driver(cluster: Cluster, args: list[str], **env: str) -> Any:
    """A Python program joined to the cluster (RAY_ADDRESS); its last line of output, JSON."""
    try:
        out = subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env={**cluster.env, "RAY_ADDRESS": cluster.gcs, **env},
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the driver timed out: {exc.stdout!r} {exc.stderr!r}"[-4000:])
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    return last_json_line(out.stdout)


def test_the_example_runs_a_workflow_as_its_tokens_user(service: Service) -> None:
    ann = _token(service, "ann")
    got = _driver(service.cluster, ["examples/in_cluster.py", "[answer 42]"], ORCH_API_KEY=ann)
    workflow = got["workflow"]
    assert got["user"] == "ann"
    assert workflow["status"] == "completed" and workflow["steps"][0]["result"] == "42"
    # The same workflow, read back over HTTP by its owner.
    with httpx.Client(base_url=service.url, timeout=120) as http:
        read = http.get(f"/workflows/{workflow['id']}", headers={"Authorization": f"Bearer {ann}"})
        assert read.status_code == 200 and read.json()["status"] == "completed"


CHECKS = """
import json, sys, time
import httpx, ray
from orchestrator.sdk import ApiError, Client

url, bob_token, cat_token, theirs, rate = sys.argv[1:6]
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
out = {}

def step(what):  # where it is, if it hangs
    print(what, file=sys.stderr, flush=True)

def status(call):
    try:
        call()
        return [200, None]
    except ApiError as exc:
        return [exc.status, exc.code]

step("bad")
with Client.in_cluster("orch_not-a-real-token-0000000000000000", max_retries=0) as bad:
    out["bad"] = status(bad.whoami)
step("bob")
with Client.in_cluster(bob_token, max_retries=0) as bob:
    out["bob"] = bob.whoami().user_uuid
    out["theirs"] = status(lambda: bob.workflow(theirs))

step("window")
# One budget per token: spend some over HTTP, the rest over the handle, then HTTP is refused.
# Started early in a rate-limit window (60 s), so the whole run falls in one.
while time.time() % 60 > 20:
    time.sleep(0.2)
auth = {"Authorization": f"Bearer {cat_token}"}
with httpx.Client(base_url=url, headers=auth, timeout=120) as http:
    out["http_first"] = [http.get("/whoami").status_code for _ in range(5)]
    with Client.in_cluster(cat_token, max_retries=0) as cat:
        ok = 0
        while ok <= 2 * int(rate):
            try:
                cat.whoami()
            except ApiError as exc:
                out["limited"] = [exc.status, exc.code]
                break
            ok += 1
        out["handle_ok"] = ok
    out["http_after"] = http.get("/whoami").status_code

print(json.dumps(out))
"""


def test_auth_ownership_and_rate_limit_are_those_of_http(service: Service) -> None:
    ann, bob, cat = (_token(service, user) for user in ("ann2", "bob", "cat"))
    with httpx.Client(base_url=service.url, timeout=120) as http:
        made = http.post(
            "/workflows",
            json={"name": "anns", "steps": [{"name": "a", "prompt": "[answer 1]"}]},
            headers={"Authorization": f"Bearer {ann}"},
        )
        assert made.status_code == 200, made.text
        mine = http.post(
            "/workflows",
            json={"name": "bobs", "steps": [{"name": "a", "prompt": "[answer 2]"}]},
            headers={"Authorization": f"Bearer {bob}"},
        )
        assert mine.status_code == 200, mine.text
    args = [service.url, bob, cat, made.json()["id"], str(RATE)]
    got = _driver(service.cluster, ["-c", CHECKS, *args])
    assert got["bad"] == [401, "unauthorized"]
    assert got["bob"] == "bob"
    assert got["theirs"] == [404, "not_found"]
    assert got["http_first"] == [200] * 5
    assert got["limited"] == [429, "rate_limited"]
    assert got["handle_ok"] == RATE - 5, got
    assert got["http_after"] == 429


STREAMS = r"""
import json, os, queue, re, sys, threading, time
import httpx, ray
from orchestrator.sdk import ApiError, Client
from orchestrator.sdk._in_cluster import HANDLE_BASE_URL, ServeTransport, serve_handle

url, admin, bob, cat, dan, dan_prefix = sys.argv[1:7]
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
BOUND = 90.0  # seconds for any one awaited thing: a stall fails here, it does not hang
out = {}

def step(what):  # where it is, if it fails
    print(what, file=sys.stderr, flush=True)

def fail(what):
    print(f"timed out waiting for {what}; so far: {out}", file=sys.stderr, flush=True)
    os._exit(3)  # a reader thread may be blocked in a handle read: do not wait for it

def reading(body):
    # `body(put)` reads a stream in a thread (a handle read blocks with no timeout) and
    # puts what it reads; `take` waits for each item with a bound.
    got = queue.Queue()
    def run():
        try:
            body(got.put)
        except BaseException as exc:
            got.put(exc)
        got.put(None)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return got, thread

def take(got, what):
    try:
        item = got.get(timeout=BOUND)
    except queue.Empty:
        fail(what)
    if isinstance(item, BaseException):
        raise item
    return item

def until(check, what):
    deadline = time.monotonic() + BOUND
    while not (found := check()):
        if time.monotonic() > deadline:
            fail(what)
        time.sleep(0.2)
    return found

def auth(token):
    return {"Authorization": f"Bearer {token}"}

http = httpx.Client(base_url=url, headers=auth(admin), timeout=120)

def sockets():  # the replicas' open SSE streams (GET /metrics flushes the replica's gauges)
    text = http.get("/metrics").text
    return int(float(re.search(r"^svc_stream_sockets (\S+)$", text, re.M).group(1)))

def workflow(token, prompt):
    made = http.post("/workflows", headers=auth(token),
                     json={"name": "s", "steps": [{"name": "a", "prompt": prompt}]})
    assert made.status_code == 200, made.text
    return made.json()["id"]

def raw(token):
    return httpx.Client(transport=ServeTransport(serve_handle()), base_url=HANDLE_BASE_URL,
                        headers=auth(token), timeout=30)

out["sockets_before"] = sockets()

step("live")
# A raw stream through the handle: the head and the `connected` comment, then an event
# committed while it is open arrives while it is open.
enough = threading.Event()
def live(put):
    with raw(bob) as client, client.stream("GET", "/sync-events") as stream:
        put(stream.headers["content-type"])
        for text in stream.iter_text():
            put(text)
            if enough.is_set():
                return
got, reader = reading(live)
out["type"] = take(got, "the head of the stream")
seen = ""
while ": connected" not in seen:
    seen += take(got, "the connected comment")
out["open"] = until(lambda: sockets() > out["sockets_before"], "the stream on the gauge") > 0
bobs = workflow(bob, "[answer 3]")
while not re.search(r"event: workflow:completed\ndata: [^\n]*" + bobs, seen):
    seen += take(got, "bob's workflow events")
positions = [int(p) for p in re.findall(r"^id: (\d+)$", seen, re.M)]
out["live_events"] = len(positions)
enough.set()
reader.join(BOUND)
out["reader_left"] = not reader.is_alive()
out["freed"] = until(lambda: sockets() == out["sockets_before"], "the stream to be freed") or True

step("resume")
# Committed while nobody reads: bob's, and another tenant's. The SDK's iterator resumes
# after the last event bob saw, then follows live ones; cat's never appear.
last = max(positions)
missed = workflow(bob, "[answer 4]")
theirs = workflow(cat, "[answer 5]")
with Client(url, token=admin) as admin_sdk:
    for wid in (missed, theirs):
        until(lambda: admin_sdk.workflow(wid).finished, "a workflow to finish")
later = {}
def follow(put):
    with Client.in_cluster(bob, max_retries=0) as sdk:
        for event in sdk.sync_events(last_event_id=last):
            put(event)
            if later and event.data.get("workflow_id") == later["id"] and "completed" in event.type:
                return  # leaving the SDK's iterator early: it closes the handle stream
got, reader = reading(follow)
events = []
while not any(e.data.get("workflow_id") == missed and "completed" in e.type for e in events):
    events.append(take(got, "the missed workflow, replayed"))
out["replayed_first"] = events[0].position > last and events[0].data.get("workflow_id") == missed
later["id"] = workflow(bob, "[answer 6]")
while not (events and events[-1].data.get("workflow_id") == later["id"]
           and "completed" in events[-1].type):
    item = take(got, "bob's next workflow, live")
    if item is None:
        fail("the SDK iterator ended")
    events.append(item)
out["resumed"] = [e.position for e in events] == sorted({e.position for e in events})
out["users"] = sorted({e.user_uuid for e in events})
out["theirs_seen"] = any(e.data.get("workflow_id") == theirs for e in events)
reader.join(BOUND)
out["sdk_left"] = not reader.is_alive()
out["sdk_freed"] = until(lambda: sockets() == out["sockets_before"], "the SDK stream freed") or True

step("revoked")
# dan's stream is open when the token is revoked: reconnecting is refused, as over HTTP.
stop_dan = threading.Event()
def dans(put):
    with raw(dan) as client, client.stream("GET", "/sync-events") as stream:
        for text in stream.iter_text():
            put(text)
            if stop_dan.is_set():
                return
got, reader = reading(dans)
seen = ""
while ": connected" not in seen:
    seen += take(got, "dan's stream")
assert http.delete(f"/tokens/{dan_prefix}").status_code == 200
def refused():
    with Client.in_cluster(dan, max_retries=0) as sdk:
        try:
            next(sdk.sync_events(reconnect=False))
        except ApiError as exc:
            return [exc.status, exc.code]
    return None
out["reconnect"] = until(refused, "the revoked token refused")
stop_dan.set()
reader.join(BOUND)
print(json.dumps(out))
"""


def test_sync_events_through_the_handle(service: Service) -> None:
    bob, cat = (_token(service, user) for user in ("sbob", "scat"))
    dan = _issued(service, "sdan")
    admin = (service.work / "data" / "admin_token").read_text().strip()
    args = [service.url, admin, bob, cat, dan["token"], dan["prefix"]]
    got = _driver(service.cluster, ["-c", STREAMS, *args])
    assert got["type"].startswith("text/event-stream")
    assert got["open"] and got["live_events"] >= 2  # started ... completed, while open
    assert got["reader_left"] and got["freed"]
    assert got["replayed_first"] and got["resumed"]
    assert got["users"] == ["sbob"] and not got["theirs_seen"]
    assert got["sdk_left"] and got["sdk_freed"]
    assert got["reconnect"] == [401, "unauthorized"]


CHAT = r"""
import json, os, queue, sys, threading, time
import ray
from orchestrator.sdk import Client

token, model = sys.argv[1:3]
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
got = queue.Queue()

def read():  # in a thread: each chunk is awaited with a bound below
    try:
        with Client.in_cluster(token, max_retries=0) as sdk:
            messages = [{"role": "user", "content": "count"}]
            for chunk in sdk.chat_completion_stream(messages, model=model):
                got.put((time.monotonic(), chunk.model_dump(mode="json")))
    except BaseException as exc:
        got.put(repr(exc))
    got.put(None)

threading.Thread(target=read, daemon=True).start()
chunks = []
while True:
    try:
        item = got.get(timeout=90)
    except queue.Empty:
        print(f"timed out after {len(chunks)} chunks", file=sys.stderr, flush=True)
        os._exit(3)
    if item is None:
        break
    assert not isinstance(item, str), item
    chunks.append(item)
start = chunks[0][0]
text = "".join(c["choices"][0]["delta"].get("content") or "" for _, c in chunks if c["choices"])
print(json.dumps({"at": [t - start for t, _ in chunks], "text": text}))
"""

PIECES = 6  # chunks of the scripted answer
DELAY_S = 1.0  # the fake's pause between them


def test_a_streamed_completion_arrives_chunk_by_chunk(service: Service) -> None:
    text = "one two three four five six "
    service.cluster.llm.script(
        [FakeReply(text=text, text_chunk=len(text) // PIECES, delay_s=DELAY_S)]
    )
    got = _driver(service.cluster, ["-c", CHAT, _token(service, "chatty"), MODEL])
    assert got["text"] == text
    # The fake pauses DELAY_S between chunks: passed on as they come, they are read with
    # those pauses between them; held back, all after the first would come in one burst.
    pauses = [b - a for a, b in pairwise(got["at"])]
    assert sum(p >= DELAY_S / 2 for p in pauses) >= PIECES - 2, got["at"]
