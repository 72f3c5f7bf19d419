"""Local inference (SPEC part 4): llama-server instances and the model registry.

An instance is a llama-server compatible process (`inference_bin`, else `llama-server` on
PATH, else the bundled cyllama launcher `python -m orchestrator.inference.llama_server`),
run (spawned, health-checked, its transitions recorded) by an `InstanceRunner`; requests go
straight to its port."""

from orchestrator.inference._instances import (
    LIVE_STATES,
    SERVING_STATES,
    TRANSITIONS,
    IllegalTransition,
    InstanceRecord,
    InstanceState,
    InstanceStore,
    LocalEndpoint,
    check_transition,
    ready_endpoints,
)
from orchestrator.inference._local import InProcessInference, LaunchFailed, LocalInference
from orchestrator.inference._models import (
    BUNDLED_MODEL_PACKAGES,
    FoundModel,
    GgufInfo,
    ModelEntry,
    ModelRecord,
    ModelRegistry,
    bundled_model_files,
    known_context,
    model_name_of,
    ollama_models,
    read_gguf_info,
    scan_models,
)
from orchestrator.inference._process import (
    BUNDLED_LAUNCHER,
    build_command,
    free_port,
    resolve_binary,
)
from orchestrator.inference._runner import InstanceRunner
from orchestrator.inference._service import DiscoveryResult, InferenceService, StartRequest

__all__ = [
    "BUNDLED_LAUNCHER",
    "BUNDLED_MODEL_PACKAGES",
    "LIVE_STATES",
    "SERVING_STATES",
    "TRANSITIONS",
    "DiscoveryResult",
    "FoundModel",
    "GgufInfo",
    "IllegalTransition",
    "InProcessInference",
    "InferenceService",
    "InstanceRecord",
    "InstanceRunner",
    "InstanceState",
    "InstanceStore",
    "LaunchFailed",
    "LocalEndpoint",
    "LocalInference",
    "ModelEntry",
    "ModelRecord",
    "ModelRegistry",
    "StartRequest",
    "build_command",
    "bundled_model_files",
    "check_transition",
    "free_port",
    "known_context",
    "model_name_of",
    "ollama_models",
    "read_gguf_info",
    "ready_endpoints",
    "resolve_binary",
    "scan_models",
]
