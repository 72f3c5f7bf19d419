"""What the inference endpoints do: start, stop and list instances, list and discover models.
Tenancy: a user sees and stops their own instances (another's is not found); admins all."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import httpx

from orchestrator.auth import Principal
from orchestrator.config import Settings
from orchestrator.errors import BadRequest, ErrorCode, NotFound, ServiceUnavailable, Unprocessable
from orchestrator.events import EventStore
from orchestrator.inference._instances import (
    IllegalTransition,
    InstanceRecord,
    InstanceState,
    InstanceStore,
)
from orchestrator.inference._local import LaunchFailed, LocalInference
from orchestrator.inference._models import (
    FoundModel,
    ModelEntry,
    ModelRecord,
    ModelRegistry,
    RemoteContexts,
    bundled_model_files,
    known_context,
    model_name_of,
    ollama_models,
    read_gguf_info,
    scan_models,
)
from orchestrator.providers import configured_providers

__all__ = ["DiscoveryResult", "InferenceService", "StartRequest"]

NO_LOCAL_INFERENCE = (
    "local inference needs Ray: start the service with `orchestrator serve` (scripts/serve)"
)


@dataclass(frozen=True, slots=True)
class StartRequest:
    model: str
    gpu_layers: int | None = None
    ctx_size: int | None = None
    threads: int | None = None


@dataclass(frozen=True, slots=True)
class DiscoveryResult:
    discovered: int
    warnings: list[str] = field(default_factory=list)


def _file_in(root: Path, name: str) -> FoundModel | None:
    """A GGUF file named `name` (with or without `.gguf`) under `root`; blocking."""
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts or "\0" in name or not relative.parts:
        return None
    for candidate in (relative, relative.with_name(relative.name + ".gguf")):
        path = root / candidate
        if path.suffix.lower() == ".gguf" and path.is_file():
            info = read_gguf_info(path)
            if info is not None:
                return FoundModel(
                    name=model_name_of(Path(candidate)),
                    provider="local",
                    path=str(path.resolve()),
                    ctx_size=info.context_length or 0,
                    size_bytes=path.stat().st_size,
                )
    return None


def _bundled(name: str) -> FoundModel | None:
    for path in bundled_model_files():
        if name in (path.name, path.stem):
            return _file_in(path.parent, path.name)
    return None


class InferenceService:
    def __init__(
        self, settings: Settings, events: EventStore, local: LocalInference | None
    ) -> None:
        self._settings = settings
        self._local = local
        self.instances = InstanceStore(events)
        self.models = ModelRegistry(events)
        self.contexts = RemoteContexts()

    @property
    def local(self) -> LocalInference | None:
        return self._local

    # --- models -------------------------------------------------------------------------

    async def resolve_model(self, name: str) -> ModelRecord:
        """A local model by registered name, or by GGUF file name under `models_dir` or in
        a bundled model package (registered on first use)."""
        for candidate in dict.fromkeys((name, name.removesuffix(".gguf"))):
            record = await self.models.get(candidate)
            if record is None:
                continue
            if record.provider != "local" or record.path is None:
                raise Unprocessable(
                    f"model {name!r} is served by the {record.provider} provider, not by a "
                    "local instance: use it through /chat/completions directly"
                )
            return record
        found = await asyncio.to_thread(_file_in, self._settings.resolved_models_dir, name)
        if found is None:
            found = await asyncio.to_thread(_bundled, name)
        if found is None:
            raise NotFound(
                f"unknown model {name!r}: it is not registered and there is no GGUF file of "
                f"that name in models_dir; an admin can register models with POST /discover",
                code=ErrorCode.MODEL_NOT_FOUND,
            )
        written = await self.models.register([found])
        if not written:  # the name belongs to another provider's model
            raise Unprocessable(f"model name {found.name!r} is taken by another provider")
        return written[0]

    async def catalog(self) -> list[ModelEntry]:
        """GET /models: registered local models with the status of their instances, Ollama's
        models, and the models configured for each remote provider."""
        records = await self.models.records()
        states = await self.instances.model_states()
        # The operator's windows (`model_ctx_sizes`) win over metadata and the table; a
        # local instance's own window is what it runs with, so that one stays first.
        given = self._settings.model_ctx_sizes
        entries: list[ModelEntry] = []
        seen: set[tuple[str, str]] = set()

        def add(entry: ModelEntry) -> None:
            if (entry.name, entry.provider) not in seen:
                seen.add((entry.name, entry.provider))
                entries.append(entry)

        for r in records:
            if r.provider == "local":
                status, ctx = states.get(r.name, ("available", r.ctx_size))
                ctx = ctx or r.ctx_size or given.get(r.name, 0)
                add(ModelEntry(r.name, status, "local", ctx, r.discovered_at))
            else:
                ctx = given.get(r.name) or r.ctx_size
                add(ModelEntry(r.name, "remote", r.provider, ctx, r.discovered_at))
        for name, (status, ctx) in states.items():
            # Its registration was removed since.
            add(ModelEntry(name, status, "local", ctx or given.get(name, 0)))
        # A configured model's window: the operator's, else its provider's metadata where
        # the API gives one (Gemini, Anthropic, Ollama), else the maintained table, else
        # unknown (null: never a made-up window).
        providers = configured_providers(self._settings)
        contexts = await asyncio.gather(*(self.contexts.of(p) for p in providers))
        for provider, known in zip(providers, contexts, strict=True):
            for model in provider.models:
                ctx = given.get(model) or known.get(model) or known_context(model)
                add(ModelEntry(model, "remote", provider.name, ctx))
        return entries

    async def discover(self) -> DiscoveryResult:
        """Register the GGUF files under `models_dir` and the bundled ones, and Ollama's
        models when Ollama is configured; forget registered ones that are gone."""
        found = await asyncio.to_thread(scan_models, self._settings.resolved_models_dir)
        replace = ["local"]
        warnings: list[str] = []
        for provider in configured_providers(self._settings):
            if provider.kind != "ollama":
                continue
            try:
                async with httpx.AsyncClient() as http:
                    found += await ollama_models(provider, http)
                replace.append("ollama")
            except (httpx.HTTPError, ValueError) as exc:
                warnings.append(f"ollama at {provider.base_url} did not answer: {exc!r}")
        written = await self.models.register(found, replace=replace)
        return DiscoveryResult(discovered=len(written), warnings=warnings)

    # --- instances ----------------------------------------------------------------------

    async def start(self, caller: Principal, request: StartRequest) -> InstanceRecord:
        if self._local is None:
            raise ServiceUnavailable(NO_LOCAL_INFERENCE)
        if not request.model.strip():
            raise BadRequest(
                "model must name a model",
                extra={"fields": [{"field": "model", "message": "not a model"}]},
            )
        model = await self.resolve_model(request.model)
        assert model.path is not None  # resolve_model returns local models only
        s = self._settings
        record = await self.instances.create(
            model_name=model.name,
            model_path=model.path,
            ctx_size=request.ctx_size if request.ctx_size is not None else s.inference_ctx_size,
            gpu_layers=(
                request.gpu_layers if request.gpu_layers is not None else s.inference_gpu_layers
            ),
            threads=request.threads if request.threads is not None else s.inference_threads,
            user_uuid=caller.user_uuid,
        )
        try:
            await self._local.start(record.id)
        except LaunchFailed as exc:
            await self.instances.transition(
                record.id,
                InstanceState.FAILED,
                event="model.start_failed",
                data={"error": exc.message},
                error=exc.message,
            )
            raise LaunchFailed(exc.message, extra={"id": record.id}) from exc
        return record

    async def get(self, caller: Principal, instance_id: str) -> InstanceRecord:
        record = await self.instances.get(instance_id)
        if record is None or not (caller.is_admin or record.user_uuid == caller.user_uuid):
            raise NotFound(f"no inference instance {instance_id!r}")
        return record

    async def visible(self, caller: Principal) -> list[InstanceRecord]:
        return await self.instances.records(None if caller.is_admin else caller.user_uuid)

    async def stop(self, caller: Principal, instance_id: str) -> InstanceRecord:
        record = await self.get(caller, instance_id)
        if record.state == InstanceState.STOPPED:
            return record
        reason = f"stopped by {caller.user_uuid}"
        if self._local is not None:
            await self._local.stop(instance_id, reason)
        return await self._record_stopped(instance_id, reason)

    async def stop_all(self, caller: Principal) -> list[str]:
        owner = None if caller.is_admin else caller.user_uuid
        ids = [r.id for r in await self.instances.records(owner, include_stopped=False)]
        reason = f"stopped by {caller.user_uuid} (stop-all)"
        if self._local is not None and ids:
            await self._local.stop_all(ids, reason)
        for instance_id in ids:
            await self._record_stopped(instance_id, reason)
        return ids

    async def _record_stopped(self, instance_id: str, reason: str) -> InstanceRecord:
        """Nothing hosted the instance (or its host recorded the stop already)."""
        record = await self.instances.get(instance_id)
        assert record is not None
        if record.state == InstanceState.STOPPED:
            return record
        try:
            return await self.instances.transition(
                instance_id, InstanceState.STOPPED, event="model.stopped", data={"reason": reason}
            )
        except IllegalTransition:  # stopped concurrently by another caller
            again = await self.instances.get(instance_id)
            assert again is not None
            return again
