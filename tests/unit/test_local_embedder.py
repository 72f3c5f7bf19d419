"""The local embedder (all-MiniLM-L6-v2 int8 on onnxruntime, issue 29): inputs run in bounded
batches padded to each batch's longest, with the vectors of one-at-a-time; an input is read
up to its first 256 word pieces exactly as the tokenizer's own truncation of the whole text
(reading only its start); requests over `EmbeddingLimits` are refused before any ONNX run.
The real model and tokenizer; the ONNX session is wrapped only to record each run's shape."""

from __future__ import annotations

import asyncio
import gzip
import importlib.resources
import random
import threading
from typing import Any

import numpy as np
import pytest

from orchestrator.errors import BadRequest
from orchestrator.memory._embed import (
    BATCH_INPUTS,
    BATCH_TOKENS,
    CLS_ID,
    HEAD_MAX_CHARS,
    LOCAL_MAX_TOKENS,
    SEP_ID,
    EmbeddingLimits,
    LocalEmbedder,
    estimate_tokens,
)

pytestmark = pytest.mark.skipif(
    LocalEmbedder.available() is not None, reason="the [embed] extra is not installed"
)

# Words that are one word piece each: N of them are N pieces.
WORDS = "the cat sat on a mat and dog ran to big red house by sea".split()


class RecordedSession:
    """The real InferenceSession; each run's `input_ids` shape and padding recorded."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.shapes: list[tuple[int, int]] = []
        self.longest: list[int] = []
        self.started = threading.Event()  # set by the first run
        self.most_at_once = 0
        self._running = 0
        self._count = threading.Lock()

    def run(self, *args: Any, **kwargs: Any) -> Any:
        feeds = args[1]
        self.shapes.append(tuple(feeds["input_ids"].shape))
        self.longest.append(int(feeds["attention_mask"].sum(axis=1).max()))
        with self._count:
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        self.started.set()
        try:
            return self._session.run(*args, **kwargs)
        finally:
            with self._count:
                self._running -= 1

    def get_inputs(self) -> Any:
        return self._session.get_inputs()


@pytest.fixture(scope="module")
def embedder() -> LocalEmbedder:
    e = LocalEmbedder(1)
    e.embed_sync(["warm up"])
    return e


@pytest.fixture
def recorded(embedder: LocalEmbedder) -> Any:
    real = embedder._session
    recorder = RecordedSession(real)
    embedder._session = recorder
    yield recorder
    embedder._session = real


def _words(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _reference_tokenizer() -> Any:
    from tokenizers import Tokenizer

    packed = importlib.resources.files("orchestrator.memory").joinpath("minilm_tokenizer.json.gz")
    tokenizer = Tokenizer.from_str(gzip.decompress(packed.read_bytes()).decode())
    tokenizer.enable_truncation(max_length=LOCAL_MAX_TOKENS)
    tokenizer.no_padding()
    return tokenizer


def test_bounded_batches_give_the_vectors_of_one_at_a_time(
    embedder: LocalEmbedder, recorded: RecordedSession
) -> None:
    # More short inputs than a batch holds, then long ones that the padded-token bound
    # splits from the rest.
    texts = [_words(n, seed=i) for i, n in enumerate([3, 5, 8, 12] * 17 + [300, 40, 250, 90, 260])]
    together = np.array(embedder.embed_sync(texts))
    runs = list(zip(recorded.shapes, recorded.longest, strict=True))
    assert len(runs) > 2, runs
    for (inputs, width), longest in runs:
        assert inputs <= BATCH_INPUTS and inputs * width <= BATCH_TOKENS, runs
        assert width == longest  # padded to the batch's longest, not the request's
    recorded.shapes.clear()
    alone = np.array([embedder.embed_sync([t])[0] for t in texts])
    assert np.abs(together - alone).max() < 1e-5
    # POST /embeddings' path: the same batches and vectors, one ONNX run a job.
    recorded.shapes.clear()
    counted, tokens = asyncio.run(embedder.embed_counted(texts, EmbeddingLimits()))
    assert np.abs(np.array(counted) - alone).max() < 1e-5
    assert all(i <= BATCH_INPUTS and i * w <= BATCH_TOKENS for i, w in recorded.shapes)
    assert tokens == sum(min(len(t.split()), LOCAL_MAX_TOKENS - 2) + 2 for t in texts)


def test_a_long_input_is_its_first_256_word_pieces(embedder: LocalEmbedder) -> None:
    long = _words(3000)
    words = long.split()
    head = " ".join(words[: LOCAL_MAX_TOKENS - 2])  # [CLS] and [SEP] take the other two
    [whole], [first], [shorter] = (
        embedder.embed_sync([t]) for t in (long, head, " ".join(words[:200]))
    )
    assert np.abs(np.array(whole) - np.array(first)).max() < 1e-5
    assert np.abs(np.array(whole) - np.array(shorter)).max() > 1e-3
    # Whitespace before the words: the start read first holds none of them, more is read.
    [spaced] = embedder.embed_sync([" " * 20_000 + long])
    assert np.abs(np.array(spaced) - np.array(first)).max() < 1e-5


def test_reading_the_start_tokenizes_as_the_whole_text_does(embedder: LocalEmbedder) -> None:
    """What the tokenizer's own truncation makes of the whole text, for texts built to trip
    a cut: accents and CJK (normalised per character), words over 100 characters ([UNK]),
    added tokens written out (`[SEP]`, `[MASK]`), long runs of spaces, no spaces at all."""
    rng = random.Random(29)
    alphabet = [*"abcdefghij klmnop,.!?  \n\téüß東京大学", "[SEP]", "[MASK]", "x" * 150, " " * 300]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4000))) for _ in range(150)]
    texts += ["東" * 5000, "y" * 30_000, "a" * 2035 + "[MASK]" + " b" * 600, ""]
    texts += [_words(n) + "[SEP]" + _words(300) for n in range(250, 258)]
    reference = _reference_tokenizer()
    assert embedder.tokenize(texts) == [reference.encode(t).ids for t in texts]
    # Never more than HEAD_MAX_CHARS of an input is read (a 30 MB word without a space took
    # 2.2 GB to tokenize whole): a word after that much whitespace is not.
    assert (
        embedder.tokenize([" " * HEAD_MAX_CHARS + "cat", " " * 5_000_000 + "cat"])
        == [[CLS_ID, SEP_ID]] * 2
    )
    assert embedder.tokenize([" " * (HEAD_MAX_CHARS - 4) + "cat"]) == [[CLS_ID, 4937, SEP_ID]]


def test_requests_take_turns_one_run_at_a_time(
    embedder: LocalEmbedder, recorded: RecordedSession
) -> None:
    """N requests at once never run N batches at once (the working set would multiply):
    one ONNX run at a time in the process, memory's filling behind included; and a small
    request asked while a big one runs is served between the big one's batches."""
    big = [_words(300, seed=i) for i in range(48)]  # six batches of 8 x 256

    async def main() -> None:
        large = asyncio.create_task(embedder.embed_counted(big, EmbeddingLimits()))
        behind = asyncio.create_task(embedder.embed(big[:16], behind=True))
        await asyncio.to_thread(recorded.started.wait, 60)
        vectors, _ = await embedder.embed_counted(["a small one"], EmbeddingLimits())
        assert len(vectors) == 1
        assert not large.done()  # served before the big request's last batches
        await asyncio.gather(large, behind)

    asyncio.run(main())
    assert len(recorded.shapes) >= 6 + 2 + 1
    assert recorded.most_at_once == 1


def test_requests_over_the_limits_are_refused_before_any_run(
    embedder: LocalEmbedder, recorded: RecordedSession
) -> None:
    limits = EmbeddingLimits(max_inputs=4, max_request_tokens=600)
    with pytest.raises(BadRequest) as many:
        asyncio.run(embedder.embed_counted(["a"] * 5, limits))
    assert "embedding_max_inputs" in many.value.message
    assert many.value.extra["limit"] == "embedding_max_inputs"
    # 3 inputs of 256 pieces: 768 tokens.
    with pytest.raises(BadRequest) as long:
        asyncio.run(embedder.embed_counted([_words(1000)] * 3, limits))
    assert "embedding_max_request_tokens" in long.value.message
    assert long.value.extra["limit"] == "embedding_max_request_tokens"
    assert recorded.shapes == []  # refused before the model ran
    # At the limit: served.
    vectors, tokens = asyncio.run(embedder.embed_counted([_words(1000)] * 2, limits))
    assert len(vectors) == 2 and tokens == 2 * LOCAL_MAX_TOKENS


def test_provider_tokens_are_estimated_from_utf8_bytes() -> None:
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("") == 1
    assert estimate_tokens("東京") == 2  # 6 bytes


def test_one_tenants_backlog_delays_another_tenant_by_a_bounded_number_of_batches(
    embedder: LocalEmbedder, recorded: RecordedSession
) -> None:
    """Issue 29: tenant A has six requests of two batches each in flight when tenant B asks
    for one embedding. Tenants take turns job by job (tokenizing or one batch), so each of
    B's two jobs waits for at most the job running and one of A's: at most three of A's
    batches start between B's asking and B's batch (first come, first served, it waited for
    a job of each of A's requests twice: about ten)."""
    texts = [_words(10, seed=i) for i in range(2 * BATCH_INPUTS)]  # two batches of 64 x 12

    async def main() -> int:
        backlog = [
            asyncio.create_task(embedder.embed_counted(texts, EmbeddingLimits(), user="tenant-a"))
            for _ in range(6)
        ]
        await asyncio.to_thread(recorded.started.wait, 60)
        asked = len(recorded.shapes)  # runs started so far, the one running included
        vectors, _ = await embedder.embed_counted(
            ["a small one"], EmbeddingLimits(), user="tenant-b"
        )
        assert len(vectors) == 1
        await asyncio.gather(*backlog)
        return asked

    asked = asyncio.run(main())
    inputs = [n for n, _ in recorded.shapes]
    assert inputs.count(1) == 1 and len(inputs) == 6 * 2 + 1, recorded.shapes
    served = inputs.index(1)  # B's batch: one input; A's are 64 each
    assert served - asked <= 3, (asked, served, recorded.shapes)
    assert served < len(inputs) - 4, "A's backlog was nearly done: the test proves nothing"
    assert recorded.most_at_once == 1
