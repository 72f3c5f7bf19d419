"""Workspace over HTTP (the app under uvicorn, real Postgres and Redis for auth, real files):
read/write/edit/search/list and their errors, traversal attempts (text and symbolic links)
refused with nothing outside the caller's root read or written, per-user and shared
isolation, atomic writes and lossless edits under concurrency (one process and two), the
size limit, binary files, and the agent tools."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from orchestrator.config import Settings
from orchestrator.workspace._paths import TMP_PREFIX
from tests.conftest import ADMIN_TOKEN, ServedApp, empty_redis, with_database

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ISO_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
SENTINEL = "SENTINEL-outside-the-root"
BOB_SECRET = "BOB-SECRET"
ETC_CANARY = "ws-test-canary-must-not-exist"
REPO = Path(__file__).resolve().parents[2]


async def _user(c: httpx.AsyncClient, name: str) -> dict[str, str]:
    made = await c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
    assert made.status_code == 200, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


@dataclass
class Served:
    c: httpx.AsyncClient
    ann: dict[str, str]
    bob: dict[str, str]
    root: Path


@asynccontextmanager
async def _served(settings: Settings) -> AsyncIterator[Served]:
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=60) as c:
            yield Served(
                c, await _user(c, "ann"), await _user(c, "bob"), settings.resolved_workspace_root
            )


@pytest.fixture
async def ws(make_settings: Any, tmp_path: Path) -> AsyncIterator[Served]:
    settings = make_settings(
        rate_limit_per_minute=0,
        workspace_root=tmp_path / "ws",
        workspace_max_file_bytes=1024 * 1024,
    )
    async with _served(settings) as served:
        yield served


# --- the operations ---------------------------------------------------------------------------


async def test_write_read_round_trip_and_shapes(ws: Served) -> None:
    c, ann = ws.c, ws.ann
    r = await c.post("/workspace/write", headers=ann, json={"path": "a/b/c.txt", "content": "hé"})
    assert r.status_code == 200
    assert r.json() == {"ok": True, "path": "a/b/c.txt", "size": 3, "created": True}
    assert (ws.root / "ann" / "a" / "b" / "c.txt").read_text() == "hé"  # parents made
    r = await c.post("/workspace/write", headers=ann, json={"path": "./a//b/c.txt", "content": "x"})
    assert r.json() == {"ok": True, "path": "a/b/c.txt", "size": 1, "created": False}
    r = await c.post("/workspace/read", headers=ann, json={"path": "a/b/c.txt"})
    assert r.json() == {"path": "a/b/c.txt", "content": "x", "size": 1, "encoding": "utf-8"}
    r = await c.post("/workspace/write", headers=ann, json={"path": "empty.txt", "content": ""})
    assert r.json()["size"] == 0
    r = await c.post("/workspace/read", headers=ann, json={"path": "empty.txt"})
    assert r.json()["content"] == "" and r.json()["size"] == 0


async def test_read_write_errors(ws: Served) -> None:
    c, ann = ws.c, ws.ann
    await c.post("/workspace/write", headers=ann, json={"path": "d/f.txt", "content": "x"})
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("read", {"path": "missing.txt"}, 404, "not_found"),
        ("read", {"path": "nodir/missing.txt"}, 404, "not_found"),
        ("read", {"path": "d"}, 400, "bad_request"),  # a directory
        ("read", {"path": "d/"}, 400, "bad_request"),
        ("read", {"path": "d/f.txt/x"}, 400, "bad_request"),  # through a file
        ("read", {"path": ""}, 400, "validation_error"),
        ("read", {}, 400, "validation_error"),
        ("read", {"path": "d/f.txt", "extra": 1}, 400, "validation_error"),
        ("read", {"path": 7}, 400, "validation_error"),
        ("write", {"path": "d", "content": "x"}, 400, "bad_request"),  # onto a directory
        ("write", {"path": "d/f.txt/x", "content": "x"}, 400, "bad_request"),
        ("write", {"path": "d/f.txt"}, 400, "validation_error"),  # content required
        ("write", {"path": "x", "content": "x", "encoding": "latin-1"}, 400, "validation_error"),
        ("write", {"path": "x", "content": "!!", "encoding": "base64"}, 400, "validation_error"),
    ]
    for op, body, status, code in cases:
        r = await c.post(f"/workspace/{op}", headers=ann, json=body)
        assert (r.status_code, r.json()["code"]) == (status, code), (op, body, r.text)
        assert r.json()["ok"] is False and r.json()["request_id"]
    assert (ws.root / "ann" / "d" / "f.txt").read_text() == "x"
    r = await c.post("/workspace/write", json={"path": "x", "content": "x"})
    assert r.status_code == 401
    r = await c.post(
        "/workspace/write",
        headers={**ann, "content-type": "application/json"},
        content=b'{"path": "s.txt", "content": "\\ud800"}',  # a lone surrogate
    )
    assert r.status_code == 400 and not (ws.root / "ann" / "s.txt").exists()


async def test_edit(ws: Served) -> None:
    c, ann = ws.c, ws.ann
    path = ws.root / "ann" / "e.txt"
    await c.post(
        "/workspace/write", headers=ann, json={"path": "e.txt", "content": "one two two two\n"}
    )
    r = await c.post(
        "/workspace/edit",
        headers=ann,
        json={"path": "e.txt", "old_text": "one", "new_text": "ONE!"},
    )
    assert r.json() == {"ok": True, "path": "e.txt", "size": 17, "replacements": 1}
    assert path.read_text() == "ONE! two two two\n"
    r = await c.post(
        "/workspace/edit", headers=ann, json={"path": "e.txt", "old_text": "two", "new_text": "2"}
    )
    assert r.status_code == 400
    body = r.json()
    assert body["error"] == "multiple matches" and body["matches"] == 3
    assert body["code"] == "multiple_matches" and body["ok"] is False
    r = await c.post(
        "/workspace/edit", headers=ann, json={"path": "e.txt", "old_text": "TWO", "new_text": "2"}
    )
    assert r.status_code == 400 and r.json()["code"] == "no_match" and r.json()["matches"] == 0
    assert "not found" in r.json()["error"]
    assert path.read_text() == "ONE! two two two\n"  # unchanged by the refusals
    # Overlapping occurrences are ambiguous too.
    await c.post("/workspace/write", headers=ann, json={"path": "o.txt", "content": "aaa"})
    r = await c.post(
        "/workspace/edit", headers=ann, json={"path": "o.txt", "old_text": "aa", "new_text": "b"}
    )
    assert r.json()["error"] == "multiple matches" and r.json()["matches"] == 2
    # Deleting text (empty new_text) and multi-line old_text are fine.
    r = await c.post(
        "/workspace/edit",
        headers=ann,
        json={"path": "e.txt", "old_text": " two two two\n", "new_text": ""},
    )
    assert r.status_code == 200 and path.read_text() == "ONE!"
    for body, status in [
        ({"path": "none.txt", "old_text": "a", "new_text": "b"}, 404),
        ({"path": "e.txt", "old_text": "", "new_text": "b"}, 400),
        ({"path": "e.txt", "old_text": "a"}, 400),
        ({"path": "", "old_text": "a", "new_text": "b"}, 400),
    ]:
        assert (await c.post("/workspace/edit", headers=ann, json=body)).status_code == status


async def test_search(ws: Served) -> None:
    c, ann = ws.c, ws.ann
    for path in [
        "README.md",
        "notes.txt",
        "docs/guide.md",
        "docs/api/ref.md",
        "src/app/main.py",
        "src/lib/util.py",
        "src/x.py",
        "b1.txt",
        "b2.txt",
        "c1.txt",
    ]:
        r = await c.post("/workspace/write", headers=ann, json={"path": path, "content": path})
        assert r.status_code == 200

    async def found(query: str, max_results: int = 100) -> list[str]:
        r = await c.post(
            "/workspace/search", headers=ann, json={"query": query, "max_results": max_results}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["count"] == len(body["results"])
        return [hit["path"] for hit in body["results"]]

    assert await found("*.md") == ["README.md"]  # top level only
    assert await found("**/*.md") == ["README.md", "docs/api/ref.md", "docs/guide.md"]
    assert await found("docs/**") == ["docs/api/ref.md", "docs/guide.md"]
    assert await found("src/*/*.py") == ["src/app/main.py", "src/lib/util.py"]
    assert await found("src/**/*.py") == ["src/app/main.py", "src/lib/util.py", "src/x.py"]
    assert await found("**/app/**") == ["src/app/main.py"]
    assert await found("b?.txt") == ["b1.txt", "b2.txt"]
    assert await found("[bc]1.txt") == ["b1.txt", "c1.txt"]
    assert await found("docs") == []  # a directory is not a result
    assert await found("nothing/**") == []
    assert len(await found("**")) == 10
    r = await c.post("/workspace/search", headers=ann, json={"query": "**", "max_results": 3})
    body = r.json()
    assert body["count"] == 3 and body["truncated"] is True
    hit = (await c.post("/workspace/search", headers=ann, json={"query": "notes.txt"})).json()
    assert hit["truncated"] is False and set(hit["results"][0]) == {"path", "size", "modified"}
    assert hit["results"][0]["size"] == len("notes.txt")
    modified = hit["results"][0]["modified"]
    assert ISO_Z.fullmatch(modified)
    when = dt.datetime.fromisoformat(modified.replace("Z", "+00:00"))
    assert abs((dt.datetime.now(dt.UTC) - when).total_seconds()) < 60
    for body in [
        {"query": "a**b"},
        {"query": ""},
        {"query": "*", "max_results": 0},
        {"query": "*", "extra": True},
        {},
    ]:
        assert (await c.post("/workspace/search", headers=ann, json=body)).status_code == 400


async def test_list(ws: Served) -> None:
    c, ann = ws.c, ws.ann
    for path in ["top.txt", "d/one.txt", "d/sub/two.txt"]:
        await c.post("/workspace/write", headers=ann, json={"path": path, "content": "12345"})
    r = await c.get("/workspace/list", headers=ann)
    body = r.json()
    assert body["path"] == "" and body["count"] == 2 and body["truncated"] is False
    assert [(e["path"], e["type"]) for e in body["entries"]] == [
        ("d", "directory"),
        ("top.txt", "file"),
    ]
    top = body["entries"][1]
    assert top["size"] == 5 and ISO_Z.fullmatch(top["modified"])
    assert body["entries"][0]["size"] == 0
    r = await c.get("/workspace/list", headers=ann, params={"path": "d", "recursive": "true"})
    assert [e["path"] for e in r.json()["entries"]] == ["d/one.txt", "d/sub", "d/sub/two.txt"]
    assert r.json()["path"] == "d" and r.json()["count"] == 3
    r = await c.get("/workspace/list", headers=ann, params={"recursive": "true"})
    assert r.json()["count"] == 5
    r = await c.get("/workspace/list", headers=ann, params={"path": "d/sub/"})
    assert [e["path"] for e in r.json()["entries"]] == ["d/sub/two.txt"]
    assert (await c.get("/workspace/list", headers=ann, params={"path": "nope"})).status_code == 404
    r = await c.get("/workspace/list", headers=ann, params={"path": "top.txt"})
    assert r.status_code == 400 and "not a directory" in r.json()["error"]
    r = await c.get("/workspace/list", headers=ann, params={"recursive": "maybe"})
    assert r.status_code == 400
    # A fresh user's workspace is empty, not missing.
    carl = await _user(c, "carl")
    assert (await c.get("/workspace/list", headers=carl)).json() == {
        "path": "",
        "entries": [],
        "count": 0,
        "truncated": False,
    }


async def test_two_users_are_isolated(ws: Served) -> None:
    c, ann, bob = ws.c, ws.ann, ws.bob
    await c.post("/workspace/write", headers=ann, json={"path": "notes.txt", "content": "ann's"})
    r = await c.post("/workspace/read", headers=bob, json={"path": "notes.txt"})
    assert r.status_code == 404
    r = await c.post(
        "/workspace/edit",
        headers=bob,
        json={"path": "notes.txt", "old_text": "ann", "new_text": "bob"},
    )
    assert r.status_code == 404
    await c.post("/workspace/write", headers=bob, json={"path": "notes.txt", "content": "bob's"})
    assert (await c.post("/workspace/read", headers=ann, json={"path": "notes.txt"})).json()[
        "content"
    ] == "ann's"
    assert (await c.post("/workspace/read", headers=bob, json={"path": "notes.txt"})).json()[
        "content"
    ] == "bob's"
    assert (ws.root / "ann" / "notes.txt").read_text() == "ann's"
    assert (ws.root / "bob" / "notes.txt").read_text() == "bob's"
    await c.post("/workspace/write", headers=ann, json={"path": "only-ann.md", "content": "a"})
    hits = (await c.post("/workspace/search", headers=bob, json={"query": "**"})).json()
    assert [h["path"] for h in hits["results"]] == ["notes.txt"]
    listed = (await c.get("/workspace/list", headers=bob, params={"recursive": "true"})).json()
    assert [e["path"] for e in listed["entries"]] == ["notes.txt"]
    # The admin has a workspace of its own, not everyone's.
    r = await c.post("/workspace/read", headers=ADMIN, json={"path": "notes.txt"})
    assert r.status_code == 404


async def test_shared_isolation(make_settings: Any, tmp_path: Path) -> None:
    settings = make_settings(
        rate_limit_per_minute=0, workspace_root=tmp_path / "shared", workspace_isolation="shared"
    )
    (tmp_path / "beside.txt").write_text(SENTINEL)
    async with _served(settings) as ws:
        c = ws.c
        r = await c.post(
            "/workspace/write", headers=ws.ann, json={"path": "team/plan.md", "content": "v1"}
        )
        assert r.status_code == 200
        assert (tmp_path / "shared" / "team" / "plan.md").read_text() == "v1"  # no user dir
        r = await c.post(
            "/workspace/edit",
            headers=ws.bob,
            json={"path": "team/plan.md", "old_text": "v1", "new_text": "v2"},
        )
        assert r.status_code == 200
        r = await c.post("/workspace/read", headers=ws.ann, json={"path": "team/plan.md"})
        assert r.json()["content"] == "v2"
        listed = (await c.get("/workspace/list", headers=ws.bob)).json()
        assert [e["path"] for e in listed["entries"]] == ["team"]
        # The shared root is still a boundary.
        for path in ["../beside.txt", "team/../../beside.txt", "/etc/hostname"]:
            r = await c.post("/workspace/read", headers=ws.bob, json={"path": path})
            assert r.status_code == 400 and r.json()["code"] == "unsafe_path"
        os.symlink(tmp_path / "beside.txt", tmp_path / "shared" / "out")
        r = await c.post("/workspace/read", headers=ws.bob, json={"path": "out"})
        assert r.status_code == 400 and SENTINEL not in r.text
        r = await c.post("/workspace/write", headers=ws.bob, json={"path": "out", "content": "x"})
        assert r.status_code == 400
    assert (tmp_path / "beside.txt").read_text() == SENTINEL


async def test_binary_files_are_base64(ws: Served) -> None:
    c, ann = ws.c, ws.ann
    blob = b"\x89PNG\r\n\x1a\n\x00\xff\xfe" + bytes(range(256))
    (ws.root / "ann").mkdir(parents=True, exist_ok=True)
    (ws.root / "ann" / "img.png").write_bytes(blob)
    r = await c.post("/workspace/read", headers=ann, json={"path": "img.png"})
    body = r.json()
    assert body["encoding"] == "base64" and body["size"] == len(blob)
    assert base64.b64decode(body["content"]) == blob
    r = await c.post(
        "/workspace/edit", headers=ann, json={"path": "img.png", "old_text": "PNG", "new_text": "x"}
    )
    assert r.status_code == 400 and "not UTF-8" in r.json()["error"]
    assert (ws.root / "ann" / "img.png").read_bytes() == blob
    encoded = base64.encodebytes(blob).decode()  # with line breaks: accepted
    r = await c.post(
        "/workspace/write",
        headers=ann,
        json={"path": "copy.bin", "content": encoded, "encoding": "base64"},
    )
    assert r.json()["size"] == len(blob)
    assert (ws.root / "ann" / "copy.bin").read_bytes() == blob


async def test_size_limit_is_413(make_settings: Any, tmp_path: Path) -> None:
    settings = make_settings(
        rate_limit_per_minute=0, workspace_root=tmp_path / "ws", workspace_max_file_bytes=1000
    )
    async with _served(settings) as ws:
        c, ann = ws.c, ws.ann
        home = ws.root / "ann"
        r = await c.post(
            "/workspace/write", headers=ann, json={"path": "big", "content": "x" * 1001}
        )
        assert r.status_code == 413 and r.json()["code"] == "payload_too_large"
        assert r.json()["limit"] == 1000 and not (home / "big").exists()
        # Bytes count, not characters: 501 two-byte characters are 1002 bytes.
        r = await c.post(
            "/workspace/write", headers=ann, json={"path": "big", "content": "é" * 501}
        )
        assert r.status_code == 413 and r.json()["size"] == 1002
        r = await c.post(
            "/workspace/write",
            headers=ann,
            json={
                "path": "big",
                "content": base64.b64encode(b"x" * 1001).decode(),
                "encoding": "base64",
            },
        )
        assert r.status_code == 413
        r = await c.post(
            "/workspace/write", headers=ann, json={"path": "ok", "content": "x" * 1000}
        )
        assert r.status_code == 200
        r = await c.post(
            "/workspace/edit", headers=ann, json={"path": "ok", "old_text": "xx", "new_text": "y"}
        )
        assert r.status_code == 400  # ambiguous, of course; now a unique anchor:
        await c.post(
            "/workspace/write", headers=ann, json={"path": "ok", "content": "A" + "x" * 999}
        )
        r = await c.post(
            "/workspace/edit", headers=ann, json={"path": "ok", "old_text": "A", "new_text": "AB"}
        )
        assert r.status_code == 413
        assert (home / "ok").read_text() == "A" + "x" * 999  # unchanged
        (home / "planted.txt").write_text("y" * 2000)  # put there by someone else
        r = await c.post("/workspace/read", headers=ann, json={"path": "planted.txt"})
        assert r.status_code == 413 and "y" * 100 not in r.text
        assert not [p for p in os.listdir(home) if p.startswith(TMP_PREFIX)]


# --- concurrency ------------------------------------------------------------------------------


async def test_concurrent_writers_never_tear_a_file(ws: Served) -> None:
    c, ann = ws.c, ws.ann
    size = 256 * 1024
    contents = [(f"writer-{i:02d}|" * (size // 10 + 1))[:size] for i in range(20)]
    await c.post("/workspace/write", headers=ann, json={"path": "race/f.txt", "content": "seed"})
    torn: list[str] = []
    writing = True

    async def read_until_done() -> int:
        reads = 0
        while writing:
            r = await c.post("/workspace/read", headers=ann, json={"path": "race/f.txt"})
            text = r.json()["content"]
            if text != "seed" and text not in contents:
                torn.append(text[:40])
            reads += 1
        return reads

    readers = [asyncio.create_task(read_until_done()) for _ in range(3)]
    results = await asyncio.gather(
        *(
            c.post("/workspace/write", headers=ann, json={"path": "race/f.txt", "content": t})
            for t in contents
        )
    )
    writing = False
    reads = sum(await asyncio.gather(*readers))
    assert all(r.status_code == 200 for r in results)
    assert torn == [] and reads > 0
    final = (ws.root / "ann" / "race" / "f.txt").read_text()
    assert final in contents
    assert os.listdir(ws.root / "ann" / "race") == ["f.txt"]  # no temp file left


async def test_concurrent_edits_lose_no_update(ws: Served) -> None:
    c, ann = ws.c, ws.ann
    n = 30
    start = "".join(f"key{i:02d}=old\n" for i in range(n))
    await c.post("/workspace/write", headers=ann, json={"path": "kv.txt", "content": start})
    results = await asyncio.gather(
        *(
            c.post(
                "/workspace/edit",
                headers=ann,
                json={
                    "path": "kv.txt",
                    "old_text": f"key{i:02d}=old",
                    "new_text": f"key{i:02d}=new",
                },
            )
            for i in range(n)
        )
    )
    assert [r.status_code for r in results] == [200] * n
    assert (ws.root / "ann" / "kv.txt").read_text() == start.replace("=old", "=new")


EDITOR = """
import asyncio, sys
from orchestrator.config import Settings
from orchestrator.workspace import Workspace

workspace = Workspace(Settings.load(environ={}, data_dir=sys.argv[1], workspace_root=sys.argv[2]))

async def main() -> None:
    print("ready", flush=True)
    sys.stdin.readline()
    await asyncio.gather(
        *(workspace.edit("ann", "shared.txt", f"p{i:02d}=old", f"p{i:02d}=new") for i in range(30))
    )

asyncio.run(main())
"""


async def test_edits_from_another_process_lose_no_update(ws: Served, tmp_path: Path) -> None:
    """An agent worker is another process on the same root: flock serialises the edits."""
    c, ann = ws.c, ws.ann
    lines = [f"p{i:02d}=old" for i in range(30)] + [f"h{i:02d}=old" for i in range(30)]
    await c.post(
        "/workspace/write", headers=ann, json={"path": "shared.txt", "content": "\n".join(lines)}
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        EDITOR,
        str(tmp_path / "data"),
        str(ws.root),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO,
    )
    assert proc.stdin and proc.stdout
    assert (await asyncio.wait_for(proc.stdout.readline(), 60)).strip() == b"ready"
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    results = await asyncio.gather(
        *(
            c.post(
                "/workspace/edit",
                headers=ann,
                json={
                    "path": "shared.txt",
                    "old_text": f"h{i:02d}=old",
                    "new_text": f"h{i:02d}=new",
                },
            )
            for i in range(30)
        )
    )
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    assert [r.status_code for r in results] == [200] * 30
    final = (ws.root / "ann" / "shared.txt").read_text()
    assert final == "\n".join(line.replace("=old", "=new") for line in lines)


# --- traversal: one app for the whole matrix (each case is one request) ----------------------


@dataclass
class Matrix:
    c: httpx.AsyncClient
    ann: dict[str, str]
    base: Path

    @property
    def home(self) -> Path:
        return self.base / "ws" / "ann"


def _snapshot(base: Path) -> dict[str, Any]:
    """Everything under `base` except Ann's own root (and the app's data dir)."""
    seen: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        rel = os.path.relpath(dirpath, base)
        if rel in ("ws/ann", "data") or rel.startswith(("ws/ann/", "data/")):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            key = os.path.relpath(path, base)
            if os.path.islink(path):
                seen[key] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                seen[key] = ("file", Path(path).read_bytes(), os.stat(path).st_mtime_ns)
            else:
                seen[key] = ("dir",)
    return seen


@pytest.fixture(scope="module")
async def matrix(
    pg_uri: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Matrix]:
    # Module-scoped (make_settings is per test): the same settings make_settings builds, on a
    # database of this module's own.
    base = tmp_path_factory.mktemp("ws-matrix")
    await empty_redis(redis_url)
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_uri)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    settings = Settings.load(
        environ={},
        database_url=with_database(pg_uri, name),
        redis_url=redis_url,
        data_dir=base / "data",
        admin_token=ADMIN_TOKEN,
        rate_limit_per_minute=0,
        workspace_root=base / "ws",
    )
    async with _served(settings) as ws:
        c = ws.c
        outside = base / "outside"
        (outside / "sub").mkdir(parents=True)
        (outside / "secret.txt").write_text(SENTINEL)
        (outside / "sub" / "deep.txt").write_text(SENTINEL)
        await c.post(
            "/workspace/write", headers=ws.bob, json={"path": "secret.txt", "content": BOB_SECRET}
        )
        await c.post(
            "/workspace/write", headers=ws.ann, json={"path": "docs/readme.md", "content": "hi"}
        )
        home = base / "ws" / "ann"
        os.symlink("/etc", home / "etc_link")
        os.symlink(base / "ws" / "bob", home / "bob_link")
        os.symlink(outside, home / "up")  # a symlinked parent directory
        os.symlink("../../outside", home / "rel_up")
        os.symlink(outside / "secret.txt", home / "file_link")
        os.symlink(outside / "nope.txt", home / "dangling")
        os.symlink(outside / "newdir", home / "dangling_dir")
        os.symlink("loop", home / "loop")
        os.symlink("../../bob", home / "docs" / "escape")
        os.symlink("readme.md", home / "docs" / "inner_file")  # inside: allowed
        os.symlink("docs", home / "docs_link")  # inside: allowed, never descended
        yield Matrix(c, ws.ann, base)
    conn = await asyncpg.connect(pg_uri)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


TRAVERSALS = [
    "..",
    "../x.txt",
    "../bob/secret.txt",
    "../../outside/secret.txt",
    "a/../../b",
    "a/../b",
    "./../x",
    "a/./../../x",
    "docs/../../bob/secret.txt",
    "a/b/../../../x",
    "/etc/passwd",
    "/",
    "//etc/passwd",
    "/tmp/x",
    "%2e%2e/outside/secret.txt",
    "%2E%2E/x",
    ".%2e/x",
    "%2e%2e%2f%2e%2e%2foutside%2fsecret.txt",
    "..%2f..%2foutside%2fsecret.txt",
    "%252e%252e/x",
    "%2fetc%2fpasswd",
    "..\\..\\outside\\secret.txt",
    "a\\..\\..\\b",
    "\\etc\\passwd",
    "..%5c..%5cx",
    "C:\\Windows\\win.ini",
    "a\x00b",
    "docs/readme.md\x00.png",
    "%00",
    "a\nb",
    "a/" + "b" * 256,
    "a/" * 600 + "x",
    "x" * 5000,
    TMP_PREFIX + "0123",
    "etc_link/passwd",
    "etc_link/hostname",
    f"etc_link/{ETC_CANARY}",
    "etc_link",
    "bob_link/secret.txt",
    "bob_link/new.txt",
    "up/secret.txt",
    "up/sub/deep.txt",
    "up/new/deeper.txt",
    "rel_up/secret.txt",
    "file_link",
    "dangling",
    "dangling_dir/x.txt",
    "loop",
    "loop/x",
    "docs/escape/secret.txt",
]


def _exists(path: str) -> bool:
    return os.path.lexists(path)


def _leaks(text: str) -> bool:
    return SENTINEL in text or BOB_SECRET in text or "root:x:" in text


@pytest.mark.parametrize("op", ["read", "write", "edit"])
@pytest.mark.parametrize("path", TRAVERSALS)
async def test_traversal_is_refused(matrix: Matrix, op: str, path: str) -> None:
    before = _snapshot(matrix.base)
    body: dict[str, Any] = {"path": path}
    if op == "write":
        body["content"] = "PWNED"
    elif op == "edit":
        body.update(old_text="never-there-\u2603", new_text="PWNED")
    r = await matrix.c.post(f"/workspace/{op}", headers=matrix.ann, json=body)
    assert r.status_code == 400, r.text
    # A NUL is refused at the edge, for every route, before the workspace sees the path.
    expected = "validation_error" if "\x00" in path else "unsafe_path"
    assert r.json()["code"] == expected and not _leaks(r.text)
    assert _snapshot(matrix.base) == before  # nothing outside Ann's root read into, or written
    assert not _exists(f"/etc/{ETC_CANARY}")
    assert (matrix.base / "outside" / "secret.txt").read_text() == SENTINEL


LIST_QUERIES = [
    "path=..",
    "path=../",
    "path=%2e%2e",
    "path=%2e%2e%2f",
    "path=%2E%2E%2Fbob",
    "path=..%2f..%2f",
    "path=%252e%252e",
    "path=/etc",
    "path=%2Fetc",
    "path=%2F",
    "path=a%5c..%5c..",
    "path=%00",
    "path=etc_link",
    "path=bob_link&recursive=true",
    "path=up",
    "path=up/sub",
    "path=rel_up",
    "path=docs/escape",
    "path=dangling_dir",
    "path=loop",
    "path=" + "a/" * 600,
]


@pytest.mark.parametrize("query", LIST_QUERIES)
async def test_list_traversal_is_refused(matrix: Matrix, query: str) -> None:
    # Sent as is: a raw query string, not re-encoded or decoded by the client.
    url = httpx.URL(f"{str(matrix.c.base_url).rstrip('/')}/workspace/list?{query}")
    assert url.query == query.encode()
    r = await matrix.c.get(url, headers=matrix.ann)
    assert r.status_code == 400, r.text
    expected = "validation_error" if "%00" in query else "unsafe_path"  # NUL: at the edge
    assert r.json()["code"] == expected and not _leaks(r.text)
    assert "passwd" not in r.text or "passwd" in query


@pytest.mark.parametrize(
    "query",
    [
        "../*",
        "../../outside/*",
        "**/../*",
        "/etc/*",
        "%2e%2e/*",
        "..%2f*",
        "a\\*",
        "*\x00",
        "up/*",
        "etc_link/*",
        "bob_link/**",
    ],
)
async def test_search_traversal_is_refused_or_finds_nothing(matrix: Matrix, query: str) -> None:
    r = await matrix.c.post(
        "/workspace/search", headers=matrix.ann, json={"query": query, "max_results": 50}
    )
    if r.status_code == 200:
        # Text that is safe but names a link out: the link is never followed.
        assert r.json() == {"results": [], "count": 0, "truncated": False}
    else:
        expected = "validation_error" if "\x00" in query else "unsafe_path"  # NUL: at the edge
        assert r.status_code == 400 and r.json()["code"] == expected
    assert not _leaks(r.text)


async def test_search_and_list_leave_links_out(matrix: Matrix) -> None:
    c, ann = matrix.c, matrix.ann
    r = await c.post("/workspace/search", headers=ann, json={"query": "**", "max_results": 1000})
    assert [h["path"] for h in r.json()["results"]] == ["docs/inner_file", "docs/readme.md"]
    assert r.json()["results"][0]["size"] == 2  # the target's size
    r = await c.get("/workspace/list", headers=ann, params={"recursive": "true"})
    listed = {e["path"]: e["type"] for e in r.json()["entries"]}
    assert listed == {
        "docs": "directory",
        "docs/inner_file": "file",
        "docs/readme.md": "file",
        "docs_link": "directory",  # a link inside the root: listed, not descended
    }
    r = await c.get("/workspace/list", headers=ann, params={"path": "docs_link"})
    assert [e["path"] for e in r.json()["entries"]] == [
        "docs_link/inner_file",
        "docs_link/readme.md",
    ]
    r = await c.post("/workspace/read", headers=ann, json={"path": "docs_link/inner_file"})
    assert r.json()["content"] == "hi"


# --- the agent tools --------------------------------------------------------------------------


async def test_agent_tools_act_in_the_task_users_workspace(
    make_settings: Any, tmp_path: Path
) -> None:
    from tests.fakes.agent_llm import agent_reply
    from tests.fakes.openai_server import OpenAIFake
    from tests.integration.test_workflows_api import agent_settings, finished

    def tool(name: str, args: str) -> str:
        return f"[tool {name} {args}]"

    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        settings = agent_settings(make_settings, llm, workspace_root=tmp_path / "ws")
        async with _served(settings) as ws:
            c = ws.c
            await c.post(
                "/workspace/write", headers=ws.bob, json={"path": "b.txt", "content": BOB_SECRET}
            )
            steps = [
                (
                    "write",
                    tool("workspace_write", '{"path": "notes/todo.md", "content": "buy milk"}'),
                ),
                (
                    "edit",
                    tool(
                        "workspace_edit",
                        '{"path": "notes/todo.md", "old_text": "milk", "new_text": "bread"}',
                    ),
                ),
                ("read", tool("workspace_read", '{"path": "notes/todo.md"}')),
                ("search", tool("workspace_search", '{"query": "**/*.md"}')),
                ("list", tool("workspace_list", '{"path": "notes"}')),
                ("escape", tool("workspace_read", '{"path": "../bob/b.txt"}')),
                ("theirs", tool("workspace_read", '{"path": "b.txt"}')),
            ]
            r = await c.post(
                "/workflows",
                headers=ws.ann,
                json={"name": "files", "steps": [{"name": n, "prompt": p} for n, p in steps]},
            )
            body = await finished(c, ws.ann, r.json()["id"])
            results = [s["result"] for s in body["steps"]]
            assert results[0] == "tool workspace_write said: created notes/todo.md (8 bytes)"
            assert results[1] == "tool workspace_edit said: edited notes/todo.md (9 bytes)"
            assert results[2] == "tool workspace_read said: buy bread"
            assert '"path": "notes/todo.md"' in results[3]
            assert '"type": "file"' in results[4] and "notes/todo.md" in results[4]
            assert "error:" in results[5] and "'..'" in results[5] and BOB_SECRET not in results[5]
            assert "error:" in results[6] and "no such file" in results[6]
            assert (ws.root / "ann" / "notes" / "todo.md").read_text() == "buy bread"
            assert (ws.root / "bob" / "b.txt").read_text() == BOB_SECRET
            r = await c.post("/workspace/read", headers=ws.bob, json={"path": "notes/todo.md"})
            assert r.status_code == 404


async def test_openapi_documents_the_endpoints(ws: Served) -> None:
    spec = (await ws.c.get("/openapi.json", headers=ws.ann)).json()
    paths = spec["paths"]
    for op in ("read", "write", "edit", "search"):
        assert set(paths[f"/api/v1/workspace/{op}"]["post"]["responses"]) >= {"200", "400", "413"}
    listing = paths["/api/v1/workspace/list"]["get"]
    assert {p["name"] for p in listing["parameters"]} == {"path", "recursive"}
    assert "WorkspaceError" in spec["components"]["schemas"]
