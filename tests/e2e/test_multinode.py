"""Two Ray nodes on one machine: a head (CPU only) and a worker that declares a GPU
(`ray start --num-gpus 1`). The service joins the cluster; an inference instance, which asks
for a GPU, lands on the GPU node; workflows run; the GPU node is stopped: the actors that were
on it are re-created on the head where resources allow, and no workflow is lost."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests.conftest import free_port
from tests.e2e.test_inference import SMOL
from tests.e2e.test_join_cluster import _stop_cluster, ray, ray_env, start_head
from tests.e2e.test_serve import ROOT, _wait_for_ready_line
from tests.e2e.test_workflows import agent_config
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake

pytestmark = pytest.mark.e2e


def _listing(env: dict[str, str], address: str, what: str) -> list[dict[str, Any]]:
    out = ray(env, "list", what, f"--address={address}", "--format=json", "--limit=1000")
    return list(json.loads(out.stdout))


@pytest.fixture
def cluster() -> Iterator[tuple[str, dict[str, str], str]]:
    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    port = free_port()
    env = ray_env()
    try:
        # The dashboard serves `ray list` below.
        start_head(
            env,
            port,
            temp_dir,
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={free_port()}",
        )
        ray(
            env,
            "start",
            f"--address=127.0.0.1:{port}",
            "--num-cpus=1",
            "--num-gpus=1",
            '--resources={"gpu_node": 1}',
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        )
        yield f"127.0.0.1:{port}", env, temp_dir
    finally:
        _stop_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _gpu_raylet(temp_dir: str) -> psutil.Process:
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "raylet" in cmd and temp_dir in cmd and "gpu_node" in cmd:
            return p
    raise AssertionError("no raylet of the GPU node")


def test_gpu_placement_and_losing_a_node(
    cluster: tuple[str, dict[str, str], str], tmp_path: Path
) -> None:
    address, env, temp_dir = cluster
    with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        config = tmp_path / "orchestrator.yaml"
        config.write_text(
            yaml.safe_dump(
                agent_config(
                    llm,
                    inference_gpus_per_instance=1,
                    inference_bin=str(ROOT / "scripts" / "llama-server"),
                    inference_ctx_size=2048,
                    inference_threads=1,
                    agent_workers=2,
                    workflow_shards=2,
                )
            )
        )
        port = free_port()
        log = tmp_path / "serve.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    str(ROOT / "scripts" / "serve"),
                    "--address",
                    address,
                    "--config",
                    str(config),
                    "--data-dir",
                    str(tmp_path / "data"),
                    "--port",
                    str(port),
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        try:
            _wait_for_ready_line(proc, log)
            token = (tmp_path / "data" / "admin_token").read_text().strip()
            with httpx.Client(
                base_url=f"http://127.0.0.1:{port}/api/v1",
                headers={"Authorization": f"Bearer {token}"},
                timeout=60,
            ) as c:
                _run(c, address, env, temp_dir)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _wait(check: Any, within: float) -> Any:
    deadline = time.monotonic() + within
    while not (got := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.5)
    return got


def _run(c: httpx.Client, address: str, env: dict[str, str], temp_dir: str) -> None:
    nodes = {n["node_id"]: n for n in _listing(env, address, "nodes")}
    gpu_nodes = {i for i, n in nodes.items() if n["resources_total"].get("GPU", 0) >= 1}
    assert len(nodes) == 2 and len(gpu_nodes) == 1
    # An inference instance asks for a GPU: it can only be on the GPU node.
    r = c.post("/inference", json={"model": SMOL})
    assert r.status_code in (200, 201, 202), r.text
    iid = r.json()["id"]

    def instance_state() -> str | None:
        state = str(c.get(f"/inference/{iid}").json()["state"])
        return state if state in ("ready", "running", "failed") else None

    assert _wait(instance_state, 180) in ("ready", "running")
    actors = _listing(env, address, "actors")
    [instance] = [
        a for a in actors if a["class_name"] == "InferenceInstance" and a["state"] == "ALIVE"
    ]
    assert instance["node_id"] in gpu_nodes
    # Workflows run across the cluster.
    ids = [
        c.post(
            "/workflows",
            json={
                "name": f"w{i}",
                "steps": [
                    {"name": "a", "prompt": "[sleep 2]"},
                    {"name": "b", "prompt": "[answer done]"},
                ],
            },
        ).json()["id"]
        for i in range(6)
    ]
    time.sleep(1.0)  # steps are in flight
    # The GPU node goes away.
    raylet = _gpu_raylet(temp_dir)
    raylet.send_signal(signal.SIGTERM)
    raylet.wait(60)

    def all_finished() -> dict[str, str] | None:
        got = {i: c.get(f"/workflows/{i}").json()["status"] for i in ids}
        return got if all(s in ("completed", "failed") for s in got.values()) else None

    statuses = _wait(all_finished, 240)
    assert set(statuses.values()) == {"completed"}, statuses
    # Every actor of the service that survives is on the head now.
    alive = [a for a in _listing(env, address, "actors") if a["state"] == "ALIVE"]
    head = next(i for i in _listing(env, address, "nodes") if i["node_id"] not in gpu_nodes)
    ours = {"WorkflowShard", "AgentWorker", "ChannelHub", "Scheduler", "EventBus", "Metrics"}
    placed = {a["class_name"]: a["node_id"] for a in alive if a["class_name"] in ours}
    assert placed and set(placed.values()) == {head["node_id"]}, placed
    # The instance cannot come back without a GPU: it is not running on the head.
    assert not [
        a
        for a in alive
        if a["class_name"] == "InferenceInstance" and a["node_id"] != instance["node_id"]
    ]
