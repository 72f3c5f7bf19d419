"""SPEC part 4, inference and models: local instances (start, stop, list) and the model list.
Chat goes through the gateway router; a local instance also answers on its own port."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from deployments.deps import AdminUser, Ctx, CurrentUser
from orchestrator.errors import ErrorCode, NotFound
from orchestrator.inference import InferenceService, StartRequest

router = APIRouter(tags=["inference"])


class StartInference(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        min_length=1,
        max_length=512,
        description="A registered model name, or a GGUF file name under models_dir",
    )
    gpu_layers: int | None = Field(None, ge=0, le=10_000, description="inference_gpu_layers")
    ctx_size: int | None = Field(None, ge=128, le=1 << 22, description="inference_ctx_size")
    threads: int | None = Field(None, ge=1, le=1024, description="inference_threads")


class StopInference(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=64)


class Started(BaseModel):
    ok: bool = True
    id: str
    state: str


class Stopped(BaseModel):
    ok: bool = True
    id: str
    state: str


class StoppedAll(BaseModel):
    ok: bool = True
    stopped: list[str]


class OpenAIModel(BaseModel):
    id: str
    object: str = "model"
    created: int
    owned_by: str
    ctx_size: int | None = Field(
        None, description="Context window in tokens (as in `models`); null when not known"
    )


class ModelList(BaseModel):
    """SPEC's `models` and, for OpenAI clients, the same models as OpenAI's list."""

    models: list[dict[str, Any]]
    object: str = "list"
    data: list[OpenAIModel]


class Discovered(BaseModel):
    ok: bool = True
    discovered: int
    warnings: list[str]


def _service(ctx: Ctx) -> InferenceService:
    return ctx.inference


@router.post("/inference", response_model=Started)
async def start_instance(body: StartInference, ctx: Ctx, caller: CurrentUser) -> Started:
    record = await _service(ctx).start(
        caller,
        StartRequest(
            model=body.model,
            gpu_layers=body.gpu_layers,
            ctx_size=body.ctx_size,
            threads=body.threads,
        ),
    )
    return Started(id=record.id, state=str(record.state))


@router.get("/inference")
async def list_instances(ctx: Ctx, caller: CurrentUser) -> dict[str, Any]:
    records = await _service(ctx).visible(caller)
    return {"ok": True, "data": [r.wire() for r in records], "total": len(records)}


@router.get("/inference/{instance_id}")
async def get_instance(
    instance_id: Annotated[str, Path(max_length=64)], ctx: Ctx, caller: CurrentUser
) -> dict[str, Any]:
    record = await _service(ctx).get(caller, instance_id)
    return {"ok": True, **record.wire()}


@router.post("/stop", response_model=Stopped)
async def stop_instance(body: StopInference, ctx: Ctx, caller: CurrentUser) -> Stopped:
    record = await _service(ctx).stop(caller, body.id)
    return Stopped(id=record.id, state=str(record.state))


@router.post("/stop-all", response_model=StoppedAll)
async def stop_all_instances(ctx: Ctx, caller: CurrentUser) -> StoppedAll:
    return StoppedAll(stopped=await _service(ctx).stop_all(caller))


@router.get("/models", response_model=ModelList)
async def list_models(ctx: Ctx, caller: CurrentUser) -> ModelList:
    catalog = await _service(ctx).catalog()
    data = [OpenAIModel(**m.openai()) for m in catalog]
    return ModelList(models=[m.wire() for m in catalog], data=data)


@router.get("/models/{model_id:path}", response_model=OpenAIModel)
async def retrieve_model(model_id: str, ctx: Ctx, caller: CurrentUser) -> OpenAIModel:
    """OpenAI's Model object; every caller sees the whole catalog, as with the list."""
    for entry in await _service(ctx).catalog():
        if entry.name == model_id:
            return OpenAIModel(**entry.openai())
    raise NotFound(
        f"unknown model {model_id!r} (GET /api/v1/models lists the models)",
        code=ErrorCode.MODEL_NOT_FOUND,
    )


@router.post("/discover", response_model=Discovered)
async def discover_models(ctx: Ctx, caller: AdminUser) -> Discovered:
    result = await _service(ctx).discover()
    return Discovered(discovered=result.discovered, warnings=result.warnings)
