"""The outbound address policy of channel deliveries and MCP servers (SSRF guard)."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from typing import Any

import httpx
import httpx2
import pytest

from orchestrator.channels import EgressPolicy
from orchestrator.egress import (
    DestinationNotAllowed,
    GuardedTransport,
    Httpx2DestinationNotAllowed,
    Httpx2GuardedTransport,
    destination_refused,
    httpx2_egress_client,
)

# Every IPv6 form that carries an IPv4 address, each with a public and internal IPv4 inside:
# (form, address, allowed). A form is judged by the IPv4 address it carries.
EMBEDDED = [
    # IPv4-compatible `::a.b.c.d` (::/96; `::` and `::1` are themselves)
    ("compatible", "::8.8.8.8", True),
    ("compatible", "::127.0.0.1", False),  # issue 29
    ("compatible", "::a9fe:a9fe", False),  # 169.254.169.254, issue 29
    ("compatible", "::10.0.0.5", False),
    ("compatible", "::0.0.0.2", False),
    # NAT64 well-known prefix 64:ff9b::/96 (RFC 6052): the last 32 bits
    ("nat64", "64:ff9b::8.8.8.8", True),
    ("nat64", "64:ff9b::7f00:1", False),  # issue 29
    ("nat64", "64:ff9b::a9fe:a9fe", False),  # issue 29
    ("nat64", "64:ff9b::192.168.1.1", False),
    # Local-use NAT64 64:ff9b:1::/48 (RFC 8215): where the IPv4 sits depends on the prefix
    # length the NAT64 uses (/48 to /96, RFC 6052 2.2), unknowable here: all refused.
    ("nat64-local", "64:ff9b:1::a00:5", False),  # issue 29 (10.0.0.5 as a /96 suffix)
    ("nat64-local", "64:ff9b:1::8.8.8.8", False),
    ("nat64-local", "64:ff9b:1:808:8:800::", False),  # 8.8.8.8 placed for a /48 prefix
    # Elsewhere in the IETF-reserved ::/8, outside those forms: no destination
    ("reserved", "64:ff9b::1:808:808", False),
    ("reserved", "1::8.8.8.8", False),
    # SIIT IPv4-translated `::ffff:0:a.b.c.d` (RFC 2765)
    ("siit", "::ffff:0:8.8.8.8", True),
    ("siit", "::ffff:0:7f00:1", False),  # issue 29
    ("siit", "::ffff:0:a9fe:a9fe", False),
    # IPv4-mapped `::ffff:a.b.c.d`
    ("mapped", "::ffff:8.8.8.8", True),
    ("mapped", "::ffff:7f00:1", False),
    ("mapped", "::ffff:169.254.169.254", False),
    # 6to4 2002:V4::/48
    ("6to4", "2002:808:808::1", True),
    ("6to4", "2002:7f00:1::", False),
    ("6to4", "2002:a9fe:a9fe::1", False),
    # Teredo 2001:0:SERVER:flags:port:~CLIENT (the client XOR-ed with ones)
    ("teredo", "2001:0:4136:e378:8000:63bf:f7f7:f7f7", True),  # client 8.8.8.8
    ("teredo", "2001:0:4136:e378:8000:63bf:80ff:fffe", False),  # client 127.0.0.1
    ("teredo", "2001:0:4136:e378:8000:63bf:5601:5601", False),  # client 169.254.169.254
    ("teredo", "2001:0:a00:1:8000:63bf:f7f7:f7f7", False),  # server 10.0.0.1
]


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("127.9.9.9", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("100.100.100.200", False),  # Alibaba metadata (CGNAT range)
        ("100.64.0.1", False),
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("::", False),
        ("fe80::1", False),
        ("fc00::1", False),
        ("fd00:ec2::254", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::ffff:169.254.169.254", False),
        ("::ffff:8.8.8.8", True),
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("not-an-ip", False),
    ],
)
def test_default_policy(address: str, allowed: bool) -> None:
    assert EgressPolicy().allows(address) is allowed


@pytest.mark.parametrize(("form", "address", "allowed"), EMBEDDED)
def test_ipv6_forms_are_judged_by_the_ipv4_they_carry(
    form: str, address: str, allowed: bool
) -> None:
    assert EgressPolicy().allows(address) is allowed, form


def test_allowed_ranges_open_only_what_they_name() -> None:
    policy = EgressPolicy(["127.0.0.0/8", "10.20.0.0/16"])
    assert policy.allows("127.0.0.1") and policy.allows("10.20.3.4")
    assert not policy.allows("10.21.0.1") and not policy.allows("169.254.169.254")
    # An opened IPv4 range is open in the IPv6 forms that carry it, and only there.
    assert policy.allows("::127.0.0.1") and policy.allows("64:ff9b::a14:304")
    assert not policy.allows("64:ff9b::a15:1") and not policy.allows("::ffff:0:a9fe:a9fe")
    # The local-use NAT64 prefix opens only by its IPv6 form (the operator's own NAT64).
    assert not policy.allows("64:ff9b:1::a14:304")
    nat64 = EgressPolicy(["64:ff9b:1:2::/96"])
    assert nat64.allows("64:ff9b:1:2::a00:5") and not nat64.allows("64:ff9b:1:3::a00:5")


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("http://127.0.0.1:8080/x", True),
        ("http://2130706433/", True),  # 127.0.0.1 as one decimal number
        ("http://0x7f.1/", True),  # hexadecimal and short form
        ("http://0177.0.0.1/", True),  # octal
        ("http://[::ffff:127.0.0.1]/", True),
        ("http://[::1]:9000/", True),
        ("http://169.254.169.254/latest/meta-data/", True),
        ("https://hooks.slack.com/services/T/B/x", False),  # a name: checked when connecting
        ("http://localhost/", False),  # likewise
        ("https://93.184.215.14/", False),
    ],
)
def test_literal_addresses_in_urls(url: str, refused: bool) -> None:
    assert EgressPolicy().literal_refused(url) is refused


@pytest.mark.parametrize(("form", "address", "allowed"), EMBEDDED)
def test_ipv6_forms_in_urls(form: str, address: str, allowed: bool) -> None:
    assert EgressPolicy().literal_refused(f"http://[{address}]:8080/hook") is not allowed, form


class _Network(httpx.AsyncBaseTransport):
    """Stands for the network behind the guard: records what would have been sent."""

    def __init__(self) -> None:
        self.sent: list[httpx.URL] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.url)
        return httpx.Response(204)


@pytest.mark.parametrize(("form", "address", "allowed"), EMBEDDED)
async def test_the_transport_connects_only_to_allowed_forms(
    form: str, address: str, allowed: bool
) -> None:
    network = _Network()
    transport = GuardedTransport(EgressPolicy(), network)
    async with httpx.AsyncClient(transport=transport) as client:
        if allowed:
            await client.post(f"http://[{address}]:8080/hook", json={})
            # sent to the checked address itself
            assert [ipaddress.ip_address(u.host) for u in network.sent] == [
                ipaddress.ip_address(address)
            ], form
        else:
            with pytest.raises(DestinationNotAllowed):
                await client.post(f"http://[{address}]:8080/hook", json={})
            assert network.sent == [], form


async def test_a_name_resolving_to_a_nat64_form_of_metadata_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DNS64 synthesises `64:ff9b::a9fe:a9fe` for a name whose A record is 169.254.169.254:
    the address the name resolves to is what is judged."""
    real = socket.getaddrinfo

    def dns64(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "metadata.dns64.test":
            return [
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("64:ff9b::a9fe:a9fe", port, 0, 0))
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns64)
    network = _Network()
    async with httpx.AsyncClient(transport=GuardedTransport(EgressPolicy(), network)) as client:
        with pytest.raises(DestinationNotAllowed):
            await client.get("http://metadata.dns64.test/latest/meta-data/")
    assert network.sent == []


# The same guard for httpx2, the HTTP client of the MCP SDK (orchestrator/tools/_mcp.py).


class _Network2(httpx2.AsyncBaseTransport):
    """The network behind an httpx2 guard: records the requests it would have sent."""

    def __init__(self, status: int = 204, headers: dict[str, str] | None = None) -> None:
        self.sent: list[httpx2.Request] = []
        self._status = status
        self._headers = headers or {}

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.sent.append(request)
        return httpx2.Response(self._status, headers=self._headers)


_TIMEOUT = httpx2.Timeout(5.0)


async def test_httpx2_client_refuses_loopback_unless_its_range_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = socket.getaddrinfo

    def dns(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "mcp.internal.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns)
    network = _Network2()
    async with httpx2_egress_client([], _TIMEOUT, inner=network) as client:
        with pytest.raises(Httpx2DestinationNotAllowed):
            await client.post("http://127.0.0.1:8080/mcp", json={})
        with pytest.raises(Httpx2DestinationNotAllowed):
            await client.get("http://mcp.internal.test:8080/mcp")  # judged by its address
    assert network.sent == []
    async with httpx2_egress_client(["127.0.0.0/8"], _TIMEOUT, inner=network) as client:
        response = await client.post("http://mcp.internal.test:8080/mcp", json={"a": 1})
    assert response.status_code == 204
    (sent,) = network.sent
    # sent to the checked address, naming the host it asked for; the caller's request still
    # names the host (the MCP SDK resolves a redirect's Location against it)
    assert sent.url.host == "127.0.0.1"
    assert sent.headers["host"] == "mcp.internal.test:8080"
    assert response.request.url.host == "mcp.internal.test"


@pytest.mark.parametrize(("form", "address", "allowed"), EMBEDDED)
async def test_httpx2_transport_connects_only_to_allowed_forms(
    form: str, address: str, allowed: bool
) -> None:
    network = _Network2()
    transport = Httpx2GuardedTransport(EgressPolicy(), network)
    async with httpx2.AsyncClient(transport=transport) as client:
        if allowed:
            await client.post(f"http://[{address}]:8080/mcp", json={})
            assert [ipaddress.ip_address(r.url.host) for r in network.sent] == [
                ipaddress.ip_address(address)
            ], form
        else:
            with pytest.raises(Httpx2DestinationNotAllowed):
                await client.post(f"http://[{address}]:8080/mcp", json={})
            assert network.sent == [], form


async def test_httpx2_client_sends_its_headers_and_follows_no_redirect() -> None:
    network = _Network2(302, {"location": "http://127.0.0.1:9/elsewhere"})
    headers = {"Authorization": "Bearer t0ken"}
    async with httpx2_egress_client(
        ["8.8.8.0/24"], _TIMEOUT, headers=headers, inner=network
    ) as client:
        response = await client.get("http://8.8.8.8/mcp")
    assert response.status_code == 302
    (sent,) = network.sent
    assert sent.headers["authorization"] == "Bearer t0ken"
    assert sent.url.path == "/mcp"


async def test_httpx2_name_resolving_to_metadata_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = socket.getaddrinfo

    def dns(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "mcp.rebind.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", dns)
    network = _Network2()
    async with httpx2_egress_client([], _TIMEOUT, inner=network) as client:
        with pytest.raises(Httpx2DestinationNotAllowed):
            await client.post("https://mcp.rebind.test/mcp", json={})
    assert network.sent == []


# The same check when a URL is saved (an MCP server's, an HTTP tool's): a 400, not a failure
# at each call.


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names the resolver answers for the test (others: as the host resolves them)."""
    names: dict[str, list[str]] = {}
    real = socket.getaddrinfo

    def resolve(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in names:
            if not names[host]:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [
                (
                    socket.AF_INET6 if ":" in a else socket.AF_INET,
                    socket.SOCK_STREAM,
                    6,
                    "",
                    (a, port, 0, 0) if ":" in a else (a, port),
                )
                for a in names[host]
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    return names


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("http://localhost:9/mcp", True),
        ("http://metadata.rebind.test/latest", True),
        ("https://mixed.test/x", True),  # one refused address among public ones is enough
        ("http://public.test/users/{id}/profile?q={q}", False),  # the host only
        ("http://metadata.rebind.test/users/{id}", True),
        ("https://nowhere.test/mcp", False),  # does not resolve: the connects judge it
        ("http://127.0.0.1:8080/x", True),
        ("http://8.8.8.8/x", False),
    ],
)
async def test_a_saved_urls_host_is_judged_by_what_it_resolves_to(
    dns: dict[str, list[str]], url: str, refused: bool
) -> None:
    dns.update(
        {
            "metadata.rebind.test": ["169.254.169.254"],
            "mixed.test": ["8.8.8.8", "10.0.0.7"],
            "public.test": ["8.8.4.4", "2001:4860:4860::8888"],
            "nowhere.test": [],
        }
    )
    assert await destination_refused(EgressPolicy(), url) is refused


async def test_an_allowed_range_opens_a_saved_urls_host(dns: dict[str, list[str]]) -> None:
    dns["svc.internal.test"] = ["10.1.2.3"]
    assert await destination_refused(EgressPolicy(), "http://svc.internal.test/mcp")
    opened = EgressPolicy(["10.0.0.0/8", "127.0.0.0/8"])
    assert not await destination_refused(opened, "http://svc.internal.test/mcp")
    assert not await destination_refused(opened, "http://127.0.0.1:9/mcp")


async def test_a_slow_resolver_leaves_a_saved_url_to_the_connects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()

    def stuck(*args: Any, **kwargs: Any) -> Any:
        release.wait(5)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", stuck)
    started = time.monotonic()
    try:
        assert not await destination_refused(EgressPolicy(), "http://slow.test/", timeout_s=0.2)
    finally:
        release.set()
    assert time.monotonic() - started < 2
