"""One HTTP request and its answer as they cross the Api deployment handle (the in-cluster
SDK's transport, orchestrator/sdk/_serve_transport.py, and the replica's side,
deployments/in_cluster.py). Plain frozen dataclasses: Ray pickles them as they are."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HandleRequest", "HandleResponse"]


@dataclass(frozen=True)
class HandleRequest:
    """One HTTP request, as sent over the deployment handle."""

    method: str
    path: str
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


@dataclass(frozen=True)
class HandleResponse:
    """The first item of an answer: its status, headers and the body that came with them;
    `more` says whether body chunks (bytes items) follow."""

    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    more: bool
