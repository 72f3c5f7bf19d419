"""SPEC part 4, inference and models: local instances (start, stop, list) and the model list.
Chat goes through the gateway router; a local instance also answers on its own port."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from deployments.deps import AdminUser, CurrentUser, Inference
from orchestrator import wire
from orchestrator.errors import ErrorCode, NotFound
from orchestrator.inference import StartRequest

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


@router.post("/inference", response_model=wire.InstanceState)
async def start_instance(
    body: StartInference, inference: Inference, caller: CurrentUser
) -> wire.InstanceState:
    record = await inference.start(
        caller,
        StartRequest(
            model=body.model,
            gpu_layers=body.gpu_layers,
            ctx_size=body.ctx_size,
            threads=body.threads,
        ),
    )
    return wire.InstanceState(id=record.id, state=str(record.state))


@router.get("/inference")
async def list_instances(inference: Inference, caller: CurrentUser) -> dict[str, Any]:
    records = await inference.visible(caller)
    return {"ok": True, "data": [r.wire() for r in records], "total": len(records)}


@router.get("/inference/{instance_id}")
async def get_instance(
    instance_id: Annotated[str, Path(max_length=64)], inference: Inference, caller: CurrentUser
) -> dict[str, Any]:
    record = await inference.get(caller, instance_id)
    return {"ok": True, **record.wire()}


@router.post("/stop", response_model=wire.InstanceState)
async def stop_instance(
    body: StopInference, inference: Inference, caller: CurrentUser
) -> wire.InstanceState:
    record = await inference.stop(caller, body.id)
    return wire.InstanceState(id=record.id, state=str(record.state))


@router.post("/stop-all", response_model=wire.InstancesStopped)
async def stop_all_instances(inference: Inference, caller: CurrentUser) -> wire.InstancesStopped:
    return wire.InstancesStopped(stopped=await inference.stop_all(caller))


@router.get("/models", response_model=wire.ModelList)
async def list_models(inference: Inference, caller: CurrentUser) -> wire.ModelList:
    catalog = await inference.catalog()
    data = [wire.Model(**m.openai()) for m in catalog]
    return wire.ModelList(models=[wire.ModelInfo(**m.wire()) for m in catalog], data=data)


@router.get("/models/{model_id:path}", response_model=wire.Model)
async def retrieve_model(model_id: str, inference: Inference, caller: CurrentUser) -> wire.Model:
    """OpenAI's Model object; every caller sees the whole catalog, as with the list."""
    for entry in await inference.catalog():
        if entry.name == model_id:
            return wire.Model(**entry.openai())
    raise NotFound(
        f"unknown model {model_id!r} (GET /api/v1/models lists the models)",
        code=ErrorCode.MODEL_NOT_FOUND,
    )


@router.post("/discover", response_model=wire.ModelsDiscovered)
async def discover_models(inference: Inference, caller: AdminUser) -> wire.ModelsDiscovered:
    result = await inference.discover()
    return wire.ModelsDiscovered(discovered=result.discovered, warnings=result.warnings)
