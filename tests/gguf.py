"""Tiny GGUF files for tests: a valid header with the metadata the registry reads."""

from __future__ import annotations

import struct
from pathlib import Path


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def write_gguf(path: Path, *, arch: str = "llama", context_length: int | None = 2048) -> Path:
    """A GGUF v3 file with no tensors: `general.architecture`, a string array (skipped by
    readers) and `<arch>.context_length`."""
    kvs = [_string("general.architecture") + struct.pack("<I", 8) + _string(arch)]
    tokens = [_string(t) for t in ("<s>", "</s>", "hello")]
    kvs.append(
        _string("tokenizer.ggml.tokens")
        + struct.pack("<I", 9)
        + struct.pack("<IQ", 8, len(tokens))
        + b"".join(tokens)
    )
    kvs.append(
        _string("tokenizer.ggml.scores")
        + struct.pack("<I", 9)
        + struct.pack("<IQ", 6, 3)
        + struct.pack("<3f", 0.0, 0.0, 0.0)
    )
    if context_length is not None:
        kvs.append(
            _string(f"{arch}.context_length")
            + struct.pack("<I", 4)
            + struct.pack("<I", context_length)
        )
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + b"".join(kvs))
    return path
