"""The client's address, in one place (the Telegram allowlist, the failed-auth throttle).

What reaches the app as the ASGI `client` is already the TCP peer of the first hop we run:
HAProxy replaces any `X-Forwarded-For` a client sent with the address it saw
(orchestrator/runtime/haproxy_harden.py) and the replica's uvicorn takes that one from
loopback; Serve's own proxy is started trusting no forwarded header
(deployments/launcher.py). Only when that peer is one of the operator's own proxies
(`trusted_proxies`) does the forwarded chain count, read from the right: the first hop that
is not a trusted proxy is the client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from functools import lru_cache

from starlette.types import Scope

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=32)
def _networks(trusted: tuple[str, ...]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(n, strict=False) for n in trusted)


def _is_trusted(addr: str | None, nets: Iterable[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(addr or "")
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in n for n in nets)


def client_address(
    peer: str | None, forwarded_for: str | None, trusted: Iterable[str]
) -> str | None:
    nets = _networks(tuple(trusted))
    if not nets or not _is_trusted(peer, nets):
        return peer
    hops = [h.strip() for h in (forwarded_for or "").split(",") if h.strip()]
    for hop in reversed(hops):
        if not _is_trusted(hop, nets):
            return hop
    return peer


def scope_client_address(scope: Scope, trusted: Iterable[str]) -> str | None:
    client = scope.get("client")
    peer = client[0] if client else None
    forwarded = None
    for key, value in scope.get("headers", ()):
        if key == b"x-forwarded-for":
            # Several header lines form one list, in order.
            text = value.decode("latin-1")
            forwarded = text if forwarded is None else f"{forwarded}, {text}"
    return client_address(peer, forwarded, trusted)
