"""The launcher's command line: llama-server's flags, as `ServerOptions`.

Separate because it is the launcher's contract with `_process.build_command` (the same flags
a real llama-server takes), read before anything else loads.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ServerOptions", "parse_args"]


@dataclass(frozen=True, slots=True)
class ServerOptions:
    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    ctx_size: int = 4096
    gpu_layers: int = -1
    threads: int = -1
    batch_size: int = 2048
    alias: str | None = None
    api_key: str | None = None

    @property
    def model_id(self) -> str:
        return self.alias or self.model


def _layers(value: str) -> int:
    # llama-server also takes "auto" and "all"; both mean "as many as fit" here.
    return -1 if value in ("auto", "all") else int(value)


def parse_args(argv: Sequence[str]) -> tuple[ServerOptions, list[str]]:
    """The options and the llama-server flags this server does not implement."""
    parser = argparse.ArgumentParser(
        prog="llama-server",
        description="llama-server compatible server on cyllama",
        allow_abbrev=False,
    )
    parser.add_argument("-m", "--model", required=True, help="GGUF model file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-c", "--ctx-size", dest="ctx_size", type=int, default=4096)
    parser.add_argument(
        "-ngl", "--n-gpu-layers", "--gpu-layers", dest="gpu_layers", type=_layers, default=-1
    )
    parser.add_argument("-t", "--threads", type=int, default=-1)
    parser.add_argument("-b", "--batch-size", dest="batch_size", type=int, default=2048)
    parser.add_argument("-a", "--alias")
    # llama-server reads the key from LLAMA_API_KEY too: the environment keeps it out of the
    # command line, which every local user can read.
    parser.add_argument("--api-key", dest="api_key", default=os.environ.get("LLAMA_API_KEY"))
    known, unknown = parser.parse_known_args(list(argv))
    options = ServerOptions(
        model=known.model,
        host=known.host,
        port=known.port,
        ctx_size=known.ctx_size,
        gpu_layers=known.gpu_layers,
        threads=known.threads,
        batch_size=known.batch_size,
        alias=known.alias,
        api_key=known.api_key or None,
    )
    return options, unknown
