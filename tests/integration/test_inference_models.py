"""The model registry over HTTP: POST /discover (GGUF files, the bundled SmolLM2, Ollama's
models) and GET /models merging local, Ollama and configured remote models."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes._loopback import RecordedRequest, Send
from tests.fakes.ollama_server import OllamaFake
from tests.gguf import write_gguf

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SMOL = "SmolLM2-135M-Instruct.Q4_1"


class OllamaWithShow(OllamaFake):
    """Ollama's `POST /api/show` as documented: `model_info` holds
    `<architecture>.context_length`; an unknown model is a 404 `{"error": ...}`."""

    async def handle(self, request: RecordedRequest, send: Send) -> None:
        if request.method == "POST" and request.path == "/api/show":
            name = (request.json or {}).get("model")
            model = next((m for m in self.models if m.name == name), None)
            if model is None:
                await self.send_json(send, 404, {"error": f"model '{name}' not found"})
                return
            await self.send_json(
                send,
                200,
                {
                    "modelfile": f"FROM {name}\n",
                    "parameters": 'stop "<|eot_id|>"',
                    "template": "{{ .Prompt }}",
                    "details": {"format": "gguf", "family": model.family},
                    "model_info": {
                        "general.architecture": model.family,
                        "general.parameter_count": 1_235_814_432,
                        f"{model.family}.context_length": 131072,
                    },
                    "capabilities": ["completion"],
                },
            )
            return
        await super().handle(request, send)


async def _token(c: httpx.AsyncClient, user: str) -> dict[str, str]:
    made = (await c.post("/api/v1/tokens", headers=ADMIN, json={"user_uuid": user})).json()
    return {"Authorization": f"Bearer {made['token']}"}


def _by_name(models: list[dict]) -> dict[tuple[str, str], dict]:
    return {(m["name"], m["provider"]): m for m in models}


async def test_discover_registers_gguf_files_and_the_bundled_model(make_settings, tmp_path: Path):
    models_dir = tmp_path / "models"
    write_gguf(models_dir / "tiny.Q8_0.gguf", context_length=1024)
    write_gguf(
        models_dir / "qwen" / "qwen2.5-0.5b-00001-of-00002.gguf", arch="qwen2", context_length=32768
    )
    write_gguf(models_dir / "qwen" / "qwen2.5-0.5b-00002-of-00002.gguf", arch="qwen2")
    (models_dir / "README.md").write_text("not a model")
    settings = make_settings(models_dir=models_dir)
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
        alice = await _token(c, "alice")
        # Nothing is registered before discovery.
        r = await c.get("/api/v1/models", headers=alice)
        assert r.status_code == 200 and r.json() == {"models": [], "object": "list", "data": []}

        r = await c.post("/api/v1/discover", headers=alice)
        assert r.status_code == 403 and r.json()["code"] == "forbidden"

        r = await c.post("/api/v1/discover", headers=ADMIN)
        assert r.status_code == 200
        assert r.json() == {"ok": True, "discovered": 3, "warnings": []}

        models = (await c.get("/api/v1/models", headers=alice)).json()["models"]
        assert models == [
            {"name": SMOL, "status": "available", "provider": "local", "ctx_size": 8192},
            {
                "name": "qwen/qwen2.5-0.5b",
                "status": "available",
                "provider": "local",
                "ctx_size": 32768,
            },
            {"name": "tiny.Q8_0", "status": "available", "provider": "local", "ctx_size": 1024},
        ]

        # One model.discovered per model, with its file; a second scan finds no news.
        page = (
            await c.get("/api/v1/events", headers=ADMIN, params={"types": "model.discovered"})
        ).json()
        assert page["total"] == 3
        tiny = next(e for e in page["data"] if e["aggregate_id"] == "tiny.Q8_0")
        assert tiny["data"]["path"] == str(models_dir / "tiny.Q8_0.gguf")
        assert tiny["data"]["provider"] == "local" and tiny["data"]["size_bytes"] > 0
        assert (await c.post("/api/v1/discover", headers=ADMIN)).json()["discovered"] == 3
        page = (
            await c.get("/api/v1/events", headers=ADMIN, params={"types": "model.discovered"})
        ).json()
        assert page["total"] == 3

        # A file that is gone is forgotten on the next scan; a new one is added.
        (models_dir / "tiny.Q8_0.gguf").unlink()
        write_gguf(models_dir / "other.gguf", context_length=4096)
        assert (await c.post("/api/v1/discover", headers=ADMIN)).json()["discovered"] == 3
        names = {m["name"] for m in (await c.get("/api/v1/models", headers=alice)).json()["models"]}
        assert names == {SMOL, "qwen/qwen2.5-0.5b", "other"}


async def test_models_merge_remote_providers_and_ollama(make_settings, tmp_path: Path):
    async with OllamaWithShow() as ollama:
        settings = make_settings(
            models_dir=tmp_path / "models",
            providers={
                "openai": {"api_key": "sk-test", "models": ["gpt-4o-mini", "gpt-4.1"]},
                "anthropic": {"api_key": "sk-ant", "models": ["claude-sonnet-4-5"]},
                "ollama": {"base_url": ollama.url, "models": ["llama3.2:latest"]},
            },
            custom_providers=[
                {
                    "id": "vllm",
                    "format": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "models": ["llama-3.1-70b"],
                }
            ],
        )
        async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
            # Before discovery: the configured models, as remote ones.
            models = _by_name((await c.get("/api/v1/models", headers=ADMIN)).json()["models"])
            assert models[("gpt-4o-mini", "openai")] == {
                "name": "gpt-4o-mini",
                "status": "remote",
                "provider": "openai",
                "ctx_size": 128000,
            }
            assert models[("gpt-4.1", "openai")]["ctx_size"] == 1047576
            assert models[("claude-sonnet-4-5", "anthropic")]["ctx_size"] == 200000
            # Configured, not yet discovered: Ollama's /api/show tells its window already.
            assert models[("llama3.2:latest", "ollama")]["ctx_size"] == 131072
            listing_shows = [q.path for q in ollama.requests].count("/api/show")
            assert listing_shows == 1
            assert models[("llama-3.1-70b", "vllm")] == {
                "name": "llama-3.1-70b",
                "status": "remote",
                "provider": "vllm",
                "ctx_size": None,
            }

            r = await c.post("/api/v1/discover", headers=ADMIN)
            assert r.json() == {"ok": True, "discovered": 3, "warnings": []}  # SmolLM2 + 2
            assert [q.path for q in ollama.requests].count("/api/show") == listing_shows + 2
            models = (await c.get("/api/v1/models", headers=ADMIN)).json()["models"]
            by_name = _by_name(models)
            assert by_name[(SMOL, "local")]["status"] == "available"
            # Discovered Ollama models carry their context length, once each.
            assert by_name[("llama3.2:latest", "ollama")] == {
                "name": "llama3.2:latest",
                "status": "remote",
                "provider": "ollama",
                "ctx_size": 131072,
            }
            assert by_name[("llava:7b", "ollama")]["ctx_size"] == 131072
            assert [m["name"] for m in models].count("llama3.2:latest") == 1
            # An Ollama model cannot be started as a local instance.
            r = await c.post("/api/v1/inference", headers=ADMIN, json={"model": "llava:7b"})
            assert r.status_code == 503  # no local inference without Ray in this app

            # Ollama unreachable: local discovery still works, the failure is reported.
            ollama.tags_status = 500
            r = (await c.post("/api/v1/discover", headers=ADMIN)).json()
            assert r["discovered"] == 1 and "ollama" in r["warnings"][0]
            # Its models were not forgotten because it did not answer.
            by_name = _by_name((await c.get("/api/v1/models", headers=ADMIN)).json()["models"])
            assert by_name[("llava:7b", "ollama")]["ctx_size"] == 131072


async def test_model_ctx_sizes_give_every_model_an_integer(make_settings, tmp_path: Path):
    """`model_ctx_sizes`: a hosted model whose window nobody knows lists the operator's
    integer (the spec's type) instead of null, and the operator's figure wins over the
    built-in table; a window under 1 is refused at load."""
    settings = make_settings(
        models_dir=tmp_path / "models",
        providers={"openai": {"api_key": "sk-test", "models": ["gpt-4o-mini", "gpt-4.1"]}},
        custom_providers=[
            {
                "id": "vllm",
                "format": "openai",
                "base_url": "http://127.0.0.1:9/v1",
                "models": ["llama-3.1-70b"],
            }
        ],
        model_ctx_sizes={"llama-3.1-70b": 131072, "gpt-4o-mini": 64000},
    )
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
        models = _by_name((await c.get("/api/v1/models", headers=ADMIN)).json()["models"])
        assert models[("llama-3.1-70b", "vllm")]["ctx_size"] == 131072
        assert models[("gpt-4o-mini", "openai")]["ctx_size"] == 64000
        assert models[("gpt-4.1", "openai")]["ctx_size"] == 1047576  # the table's
    with pytest.raises(ValueError, match="model_ctx_sizes"):
        make_settings(model_ctx_sizes={"m": 0})


async def test_inference_without_ray_is_503_but_models_work(make_settings, tmp_path: Path):
    settings = make_settings(models_dir=tmp_path / "models")
    async with ServedApp(settings) as app, httpx.AsyncClient(base_url=app.url) as c:
        r = await c.post("/api/v1/inference", headers=ADMIN, json={"model": SMOL})
        assert r.status_code == 503 and "needs Ray" in r.json()["error"]
        assert r.json()["code"] == "service_unavailable"
        assert (await c.get("/api/v1/inference", headers=ADMIN)).json() == {
            "ok": True,
            "data": [],
            "total": 0,
        }
        r = await c.post("/api/v1/stop", headers=ADMIN, json={"id": "inf-1"})
        assert r.status_code == 404
        assert (await c.post("/api/v1/stop-all", headers=ADMIN)).json() == {
            "ok": True,
            "stopped": [],
        }
