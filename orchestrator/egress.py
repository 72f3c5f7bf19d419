"""Outbound requests to addresses users choose (a channel's `webhook_url`, `callback_url`):
never to this host, the cluster's private networks or a cloud metadata service (SSRF).

The check is on the address actually connected to: the transport resolves the host once,
refuses unless every address it resolves to is public (or in `outbound_allowed_cidrs`), and
connects to that checked address (TLS still names the host), so DNS rebinding between check
and connect cannot pass. Redirects are not followed (each hop would be a new request through
the same check anyway). Hosts of the operator's own `channel_api_base_urls` are trusted as
configured (tests point them at loopback fakes).

The MCP SDK speaks through `httpx2` (a fork of httpx with its own classes), so the same guard
exists twice: `GuardedTransport` for httpx and `Httpx2GuardedTransport` for httpx2, both on
one resolve-and-check (`_checked_address`). The SDK follows a redirect only within the
endpoint's origin, and each hop goes through the guard again. The same check judges a URL
when it is saved (`destination_refused`: an MCP server's, an HTTP tool's), for a clear 400.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

import httpx
import httpx2

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
        # Reserved by the IETF: nothing in it is a public destination. The forms in it that
        # carry an IPv4 address are judged by that address before this list is consulted
        # (`_judged_as`); what remains (`64:ff9b::1:0:0`, `1::1`, ...) is refused. That
        # includes the local-use NAT64 prefix 64:ff9b:1::/48 (RFC 8215): a NAT64 may use any
        # /48 to /96 inside it, and RFC 6052 puts the IPv4 address at a different place for
        # each length, so which IPv4 address such an address reaches cannot be known here.
        "::/8",
    )
]

_V4_COMPATIBLE = ipaddress.ip_network("::/96")  # `::a.b.c.d` (RFC 4291, deprecated)
_SIIT = ipaddress.ip_network("::ffff:0:0:0/96")  # `::ffff:0:a.b.c.d` (RFC 2765)
_NAT64_WELL_KNOWN = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052: the IPv4 is the last 32 bits
_SELF = (ipaddress.IPv6Address("::"), ipaddress.IPv6Address("::1"))


class DestinationNotAllowed(httpx.TransportError):
    """The destination resolves to an address outbound requests may not reach."""


def _judged_as(ip: IPAddress) -> list[IPAddress]:
    """The addresses `ip` is judged by: the IPv4 address(es) an IPv6 form carries, since a
    packet to it ends up there (the host's own stack, a NAT64 gateway, a 6to4 or Teredo
    relay), else `ip` itself. A Teredo address carries its server and its client (XOR-ed),
    both of which receive packets; each must pass."""
    if isinstance(ip, ipaddress.IPv4Address):
        return [ip]
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.ipv4_mapped is not None:
        return [ip.ipv4_mapped]
    if ip in _SIIT or ip in _NAT64_WELL_KNOWN:
        return [low32]
    if ip in _V4_COMPATIBLE and ip not in _SELF:  # `::` and `::1` are themselves
        return [low32]
    if ip.sixtofour is not None:
        return [ip.sixtofour]
    if ip.teredo is not None:
        server, client = ip.teredo
        return [server, client]
    return [ip]


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
        return self.trusted_origin(url.scheme, url.host, url.port)

    def trusted_origin(self, scheme: str, host: str, port: int | None) -> bool:
        port = port or (443 if scheme == "https" else 80)
        return f"{scheme}://{host.lower()}:{port}" in self._trusted

    def allows(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        # A range the operator opened by its IPv6 form (their own NAT64 prefix, say) opens
        # the address as written; otherwise each address it carries must pass on its own.
        if self._opened(ip):
            return True
        return all(self._opened(a) or self._public(a) for a in _judged_as(ip))

    def _opened(self, ip: IPAddress) -> bool:
        return any(ip in n for n in self._allowed)

    @staticmethod
    def _public(ip: IPAddress) -> bool:
        return ip.is_global and not any(ip in n for n in _ALWAYS_BLOCKED)

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


class _Unresolvable(Exception):
    """The host has no address (not a refusal: a name may resolve later)."""


class _Refused(Exception):
    """An address the host resolves to may not be reached."""


async def _checked_address(policy: EgressPolicy, host: str, port: int) -> str:
    """The address to connect to for `host`: resolved once, and only if every address the
    host resolves to is allowed (raises `_Unresolvable` or `_Refused` otherwise)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise _Unresolvable(str(exc)) from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses or not all(policy.allows(a) for a in addresses):
        raise _Refused
    return addresses[0]


RESOLVE_TIMEOUT_S = 5.0  # a saved URL's host: a resolver this slow leaves it to the connects


async def destination_refused(
    policy: EgressPolicy, url: str, *, timeout_s: float = RESOLVE_TIMEOUT_S
) -> bool:
    """Whether `url`'s host resolves to an address `policy` refuses (any one of them), by
    the check each connect makes: for a clear 400 when a URL is saved (`localhost`, a name
    pointing at the metadata service). A host that does not resolve (now, or within
    `timeout_s`) is not refused here: the connects resolve it again and check each time.
    Only the host is looked at: a path may hold `{placeholders}`."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return False  # not a URL: its validation says so
    if not host:
        return False
    port = port or (443 if parts.scheme == "https" else 80)
    if policy.trusted_origin(parts.scheme, host, port):
        return False
    try:
        async with asyncio.timeout(timeout_s):
            await _checked_address(policy, host, port)
    except (_Unresolvable, TimeoutError):
        return False
    except _Refused:
        return True
    return False


class GuardedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that connects only to allowed, already checked addresses."""

    def __init__(self, policy: EgressPolicy, inner: httpx.AsyncBaseTransport | None = None):
        self._policy = policy
        self._inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if self._policy.trusted(url):
            return await self._inner.handle_async_request(request)
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            chosen = await _checked_address(self._policy, host, port)
        except _Unresolvable as exc:
            raise httpx.ConnectError(f"cannot resolve the host ({exc})", request=request) from None
        except _Refused:
            raise DestinationNotAllowed("destination not allowed", request=request) from None
        pinned = url.copy_with(host=chosen)
        request.url = pinned
        request.headers["Host"] = url.netloc.decode("ascii")
        if url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": host}
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class Httpx2DestinationNotAllowed(httpx2.TransportError):
    """`DestinationNotAllowed` of an httpx2 client."""


class Httpx2GuardedTransport(httpx2.AsyncBaseTransport):
    """`GuardedTransport` for httpx2 (the MCP SDK's HTTP client). The request handed on is a
    copy naming the checked address, so the request the caller keeps (and the SDK resolves
    a redirect's Location against) still names the host."""

    def __init__(self, policy: EgressPolicy, inner: httpx2.AsyncBaseTransport | None = None):
        self._policy = policy
        self._inner = inner or httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        if self._policy.trusted_origin(url.scheme, url.host, url.port):
            return await self._inner.handle_async_request(request)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            chosen = await _checked_address(self._policy, url.host, port)
        except _Unresolvable as exc:
            raise httpx2.ConnectError(f"cannot resolve the host ({exc})", request=request) from None
        except _Refused:
            raise Httpx2DestinationNotAllowed("destination not allowed", request=request) from None
        extensions = dict(request.extensions)
        if url.scheme == "https":
            extensions["sni_hostname"] = url.host
        pinned = httpx2.Request(
            request.method,
            url.copy_with(host=chosen),
            headers=request.headers,
            stream=request.stream,
            extensions=extensions,
        )
        pinned.headers["Host"] = url.netloc.decode("ascii")
        return await self._inner.handle_async_request(pinned)

    async def aclose(self) -> None:
        await self._inner.aclose()


def httpx2_egress_client(
    allowed_cidrs: Iterable[str],
    timeout: httpx2.Timeout,
    *,
    headers: Mapping[str, str] | None = None,
    trusted_base_urls: Iterable[str] = (),
    inner: httpx2.AsyncBaseTransport | None = None,
) -> httpx2.AsyncClient:
    """An httpx2 client (for the MCP SDK's transports) that reaches only allowed addresses,
    sends `headers` on every request and follows no redirect of its own accord (the SDK
    follows same-origin ones itself, each through the guard). `inner`: the transport behind
    the guard (default: the network)."""
    policy = EgressPolicy(allowed_cidrs, [EgressPolicy.origin_of(u) for u in trusted_base_urls])
    return httpx2.AsyncClient(
        transport=Httpx2GuardedTransport(policy, inner),
        headers=dict(headers or {}),
        timeout=timeout,
        follow_redirects=False,
        trust_env=False,
    )


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
