"""Generation on cyllama (llama.cpp): the model and its one context (`Engine`), the prompt
from the chat template, sampling (grammar, logit bias, penalties, seed), and the text cut at
stop strings (`StopMatcher`) without splitting a UTF-8 character.

Separate from HTTP because it is blocking code run in a thread, one generation at a time;
it never sees a request object, only a judged `ChatBody`. cyllama is imported when a model is
loaded, not with the module.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.inference._llama_server.options import ServerOptions
from orchestrator.inference._llama_server.request import (
    ApiError,
    ChatBody,
    bad_request,
    json_grammar,
    json_schema,
)

__all__ = ["Engine", "Outcome", "Prepared", "StopMatcher"]

log = logging.getLogger("llama-server")

DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's "pick a random seed"
MAX_PENDING_TOKENS = 8  # bytes of one UTF-8 character never span more tokens than this


class StopMatcher:
    """Holds back text that may be the start of a stop string; cuts at the first one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._buffer = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if not self._stops:
            return text
        self._buffer += text
        hits = [i for i in (self._buffer.find(s) for s in self._stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self._buffer = self._buffer[: min(hits)], ""
            return out
        keep = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self._buffer)), 0, -1):
                if self._buffer.endswith(stop[:n]):
                    keep = max(keep, n)
                    break
        out = self._buffer[: len(self._buffer) - keep]
        self._buffer = self._buffer[len(self._buffer) - keep :]
        return out

    def flush(self) -> str:
        out, self._buffer = self._buffer, ""
        return out


@dataclass
class Prepared:
    tokens: list[int]
    limit: int
    biases: list[tuple[int, float]] = field(default_factory=list)
    grammar: str | None = None  # GBNF the answer must follow (response_format)


@dataclass
class Outcome:
    completion_tokens: int = 0
    finish_reason: Literal["stop", "length"] = "stop"
    pieces: list[str] = field(default_factory=list)


class Engine:
    """The model and one context, used by one generation at a time."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.n_ctx = 0
        self.meta: dict[str, Any] = {}
        self._lib: Any = None
        self._model: Any = None
        self._vocab: Any = None
        self._ctx: Any = None
        self._template: str | None = None
        self._eog: list[int] = []
        self.fingerprint = ""

    def load(self) -> None:
        """Blocking: load the model and create the context."""
        from cyllama.llama import llama_cpp as lib
        from cyllama.utils.validation import validate_gguf_file

        validate_gguf_file(self.options.model, kind="GGUF model")
        lib.disable_logging()
        lib.ggml_backend_load_all()
        model_params = lib.LlamaModelParams()
        model_params.n_gpu_layers = self.options.gpu_layers
        model = lib.LlamaModel(self.options.model, model_params)
        n_ctx = self.options.ctx_size if self.options.ctx_size > 0 else model.n_ctx_train
        threads = self.options.threads if self.options.threads > 0 else (os.cpu_count() or 4)
        ctx_params = lib.LlamaContextParams()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = min(self.options.batch_size, n_ctx)
        ctx_params.n_threads = threads
        ctx_params.n_threads_batch = threads
        ctx_params.no_perf = True
        self._ctx = lib.LlamaContext(model, ctx_params)
        self._lib, self._model, self._vocab = lib, model, model.get_vocab()
        self._template = model.get_default_chat_template() or None
        vocab = self._vocab
        self._eog = [t for t in range(vocab.n_vocab) if vocab.is_eog(t)]
        self.n_ctx = n_ctx
        self.meta = {
            "n_ctx_train": model.n_ctx_train,
            "n_params": model.n_params,
            "size": model.size,
            "n_vocab": self._vocab.n_vocab,
        }
        self.fingerprint = _fingerprint(lib, self.options, self.meta, n_ctx, threads)

    def prompt(self, messages: list[dict[str, str]]) -> str:
        lib = self._lib
        chat = [lib.LlamaChatMessage(role=m["role"], content=m["content"]) for m in messages]
        if self._template:
            try:
                return str(self._model.chat_apply_template(self._template, chat, True))
            except (RuntimeError, ValueError) as exc:
                # As llama-server: a template llama.cpp does not know falls back to chatml.
                log.warning("chat template not supported (%s); using chatml", exc)
        return str(self._model.chat_apply_template("chatml", chat, True))

    def prepare(self, messages: list[dict[str, str]], body: ChatBody) -> Prepared:
        """The prompt's tokens and the sampling inputs; raises ApiError (400) before any
        answer is sent."""
        biases = self._biases(body)
        schema = json_schema(body)
        grammar = None if schema is None else json_grammar(schema)
        limit = body.limit
        tokens = list(self._vocab.tokenize(self.prompt(messages), True, True))
        room = self.n_ctx - len(tokens)
        if room <= 0:
            raise ApiError(
                400,
                "the request exceeds the available context size, try increasing it",
                "exceed_context_size_error",
                n_prompt_tokens=len(tokens),
                n_ctx=self.n_ctx,
            )
        return Prepared(tokens, room if limit is None else min(limit, room), biases, grammar)

    def _biases(self, body: ChatBody) -> list[tuple[int, float]]:
        biases: dict[int, float] = {}
        for key, bias in (body.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                raise bad_request(f"logit_bias: {key!r} is not a token id") from None
            if not 0 <= token < self._vocab.n_vocab:
                raise bad_request(f"logit_bias: token {token} is out of the vocabulary")
            biases[token] = float(bias)
        if body.ignore_eos:
            biases.update((t, float("-inf")) for t in self._eog)
        return list(biases.items())

    def _sampler(self, body: ChatBody, prepared: Prepared) -> Any:
        lib, biases = self._lib, prepared.biases
        params = lib.LlamaSamplerChainParams()
        params.no_perf = True
        sampler = lib.LlamaSampler(params)
        if prepared.grammar is not None:
            # First in the chain: the others then choose among the tokens it allows.
            sampler.add_grammar(self._vocab, prepared.grammar, "root")
        if biases:
            sampler.add_logit_bias(self._vocab.n_vocab, biases)
        if body.repeat_last_n != 0 and (
            body.repeat_penalty != 1.0 or body.frequency_penalty or body.presence_penalty
        ):
            sampler.add_penalties(
                body.repeat_last_n,
                body.repeat_penalty,
                body.frequency_penalty,
                body.presence_penalty,
            )
        if body.temperature <= 0:
            sampler.add_greedy()
            return sampler
        sampler.add_top_k(body.top_k)
        sampler.add_top_p(body.top_p, 1)
        sampler.add_min_p(body.min_p, 1)
        sampler.add_temp(body.temperature)
        sampler.add_dist(DEFAULT_SEED if body.seed is None else body.seed & 0xFFFFFFFF)
        return sampler

    def _decode(self, tokens: list[int], position: int) -> None:
        status = self._ctx.decode(self._lib.llama_batch_get_one(tokens, position))
        if status not in (None, 0):
            raise RuntimeError(f"llama_decode failed with status {status}")

    def _text_after(self, anchor: int | None, tokens: list[int]) -> str:
        """The text of `tokens`, decoded together. Decoded after the token before them and
        cut off again, because llama.cpp drops a leading space from the first token."""
        head = [] if anchor is None else [anchor]
        size = 16 * (len(tokens) + 2)
        full = str(self._vocab.detokenize(head + tokens, size, False, False))
        before = str(self._vocab.detokenize(head, size, False, False)) if head else ""
        return full[len(before) :] if full.startswith(before) else full

    def generate(
        self,
        prepared: Prepared,
        body: ChatBody,
        emit: Callable[[str], object],
        cancel: threading.Event,
    ) -> Outcome:
        """Blocking: sample up to `prepared.limit` tokens, calling `emit` with text."""
        vocab, outcome = self._vocab, Outcome()
        stops = StopMatcher(body.stops)
        self._ctx.kv_cache_clear()
        batch = min(self.options.batch_size, self.n_ctx)
        for start in range(0, len(prepared.tokens), batch):
            self._decode(prepared.tokens[start : start + batch], start)
        sampler = self._sampler(body, prepared)
        position = len(prepared.tokens)
        pending: list[int] = []
        anchor: int | None = None  # the last token whose text was emitted whole
        outcome.finish_reason = "length"
        while outcome.completion_tokens < prepared.limit and not cancel.is_set():
            token = sampler.sample(self._ctx, -1)
            if vocab.is_eog(token):
                outcome.finish_reason = "stop"
                break
            outcome.completion_tokens += 1
            piece = vocab.token_to_piece(token, 0, False)
            if pending or "\ufffd" in piece:
                # Part of a multi-byte character: decode the tokens together.
                pending.append(token)
                piece = self._text_after(anchor, pending)
                if piece.endswith("\ufffd") and len(pending) < MAX_PENDING_TOKENS:
                    piece = ""
                else:
                    pending = []
            if not pending:
                anchor = token
            if piece:
                text = stops.feed(piece)
                if text:
                    emit(text)
                if stops.stopped:
                    outcome.finish_reason = "stop"
                    break
            if position + 1 >= self.n_ctx:
                break  # the context is full
            self._decode([token], position)
            position += 1
        if pending and not stops.stopped:
            text = stops.feed(self._text_after(anchor, pending))
            if text:
                emit(text)
        if not stops.stopped and (rest := stops.flush()):
            emit(rest)
        return outcome


def _fingerprint(
    lib: Any, options: ServerOptions, meta: dict[str, Any], n_ctx: int, threads: int
) -> str:
    """OpenAI's `system_fingerprint` (a string, never null in its schema): what a seeded
    answer depends on, so callers comparing answers see when the backend changed. llama.cpp
    build, cyllama, the model, the window and the CPU threads (their reductions round
    differently)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        binding = version("cyllama")
    except PackageNotFoundError:
        binding = "unknown"
    config = [lib.ggml_version(), lib.ggml_commit(), binding, meta, n_ctx, threads]
    config += [options.gpu_layers, options.batch_size]
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    return f"fp_{digest.hexdigest()[:10]}"
