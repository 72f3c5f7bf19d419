"""Outbound requests to addresses users choose (a channel's `webhook_url`, `callback_url`):
never to this host, the cluster's private networks or a cloud metadata service (SSRF).

The check is on the address actually connected to: the transport resolves the host once,
refuses unless every address it resolves to is public (or in `outbound_allowed_cidrs`), and
connects to that checked address (TLS still names the host), so DNS rebinding between check
and connect cannot pass. Redirects are not followed (each hop would be a new request through
the same check anyway). Hosts of the operator's own `channel_api_base_urls` are trusted as
configured (tests point them at loopback fakes).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

import httpx

from orchestrator.config import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# Beyond what `is_global` already excludes (private, loopback, link-local, reserved,
# unspecified, shared 100.64/10, documentation, benchmarking, ...).
_ALWAYS_BLOCKED = [
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",
        "169.254.0.0/16",  # link-local, incl. 169.254.169.254 (AWS, GCP, Azure metadata)
        "100.64.0.0/10",  # carrier-grade NAT; Alibaba's metadata at 100.100.100.200
        "fd00:ec2::/32",  # AWS metadata over IPv6 (inside fc00::/7 too)
        "224.0.0.0/4",
        "ff00::/8",
    )
]


class DestinationNotAllowed(httpx.TransportError):
    """The destination resolves to an address outbound requests may not reach."""


def _plain(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip.teredo is not None:
            return ip.teredo[1]
    return ip


class EgressPolicy:
    def __init__(self, allowed_cidrs: Iterable[str] = (), trusted_origins: Iterable[str] = ()):
        self._allowed: list[Network] = [
            ipaddress.ip_network(c, strict=False) for c in allowed_cidrs
        ]
        self._trusted = {o for o in trusted_origins if o}

    @staticmethod
    def origin_of(url: str) -> str:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"

    def trusted(self, url: httpx.URL) -> bool:
        port = url.port or (443 if url.scheme == "https" else 80)
        return f"{url.scheme}://{url.host.lower()}:{port}" in self._trusted

    def allows(self, address: str) -> bool:
        try:
            ip = _plain(ipaddress.ip_address(address.split("%", 1)[0]))
        except ValueError:
            return False
        if any(ip in n for n in self._allowed):
            return True
        if any(ip in n for n in _ALWAYS_BLOCKED):
            return False
        return ip.is_global

    def literal_refused(self, url: str) -> bool:
        """Whether `url` names (in any spelling the resolver accepts) an address that is
        refused: for a clear 400 when the URL is configured; connects are checked anyway."""
        host = urlsplit(url).hostname or ""
        try:
            packed = socket.getaddrinfo(
                host, None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
            )
        except (socket.gaierror, UnicodeError):
            return False  # a name: resolved when connecting
        return not all(self.allows(str(info[4][0])) for info in packed)


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that connects only to allowed, already checked addresses."""

    def __init__(self, policy: EgressPolicy, inner: httpx.AsyncHTTPTransport | None = None):
        self._policy = policy
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if self._policy.trusted(url):
            return await self._inner.handle_async_request(request)
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, port, type=socket.SOCK_STREAM
            )
        except (socket.gaierror, UnicodeError) as exc:
            raise httpx.ConnectError(f"cannot resolve the host ({exc})", request=request) from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses or not all(self._policy.allows(a) for a in addresses):
            raise DestinationNotAllowed("destination not allowed", request=request)
        chosen = addresses[0]
        pinned = url.copy_with(host=chosen)
        request.url = pinned
        request.headers["Host"] = url.netloc.decode("ascii")
        if url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": host}
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


def channel_egress(settings: Settings) -> httpx.AsyncClient:
    """The client channel deliveries go out through."""
    return egress_client(
        settings.outbound_allowed_cidrs,
        settings.channel_api_base_urls.values(),
        httpx.Timeout(30.0, connect=5.0),
    )


def egress_client(
    allowed_cidrs: Iterable[str], trusted_base_urls: Iterable[str], timeout: httpx.Timeout
) -> httpx.AsyncClient:
    policy = EgressPolicy(allowed_cidrs, [EgressPolicy.origin_of(u) for u in trusted_base_urls])
    return httpx.AsyncClient(
        transport=GuardedTransport(policy), timeout=timeout, follow_redirects=False
    )
