"""The HTTP client of upstream calls.

`UpstreamClient` is an `httpx.AsyncClient` (every caller of providers can use httpx's API)
whose transport is aiohttp's connection pool, and which also offers that pool directly:
`_http.post_json` and `_http.open_stream` (the adapters' chat, stream and embedding calls)
go to aiohttp without httpx's request and response models in between. Measured on the
gateway's hot path: httpx's layers over aiohttp cost ~0.2 ms of a 0.3 ms upstream call
(request building, header models, the byte-stream wrappers), so they are skipped where the
adapters need only a status, headers and the body. Everything else (Gemini's own streaming,
inference probes, channels) keeps the httpx API over the same pool.

`UpstreamResponse` is the part of `httpx.Response` the adapters read: `status_code`,
`headers` (case-insensitive `get`), `content`, `aread()`, `aiter_bytes()`, `aiter_lines()`
(lines split on CRLF, LF or CR, without their ending, as httpx and the SSE spec do).

Streamed text is always UTF-8 (`utf8_lines`): an event stream is UTF-8 by definition (the SSE
specification), and so are NDJSON and JSON, whatever charset the Content-Type names or
leaves out. The HTTP library is never asked for an encoding: aiohttp's `get_encoding()`
raises on an unread body whose Content-Type has no charset (llama.cpp's server sends
`text/event-stream` bare), and would guess or honour a wrong declared one.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import re
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from orchestrator.config import Settings
from orchestrator.providers._types import ProviderError

__all__ = ["UpstreamClient", "UpstreamResponse", "upstream_client", "utf8_lines"]

MAX_CONNECTIONS = 1000
KEEPALIVE_S = 30.0


class _NoCookies(httpx.Cookies):
    """A cookie jar that keeps nothing. Upstream calls are stateless and made for many
    tenants over one client: a cookie one tenant's call received must not ride on
    another's. And httpx parsing every response's cookies was ~10% of a gateway call's CPU."""

    def extract_cookies(self, response: httpx.Response) -> None:
        return None


_NO_COOKIES = _NoCookies()


class UpstreamClient(httpx.AsyncClient):
    """An httpx client without a cookie jar (see `_NoCookies`); with `session`, the aiohttp
    session under its transport, for the direct calls of `_http` (None: httpx only, e.g. a
    client that must send paths byte for byte)."""

    def __init__(self, *, session: _Session | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.session = session

    @property
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES

    @cookies.setter
    def cookies(self, cookies: Any) -> None:
        if cookies:
            raise ValueError("upstream clients keep no cookies")

    async def aclose(self) -> None:
        await super().aclose()
        if self.session is not None:
            await self.session.aclose()  # the transport closes it only once it has used it


class _Session:
    """One aiohttp session, made on first use (aiohttp wants a running loop), shared by the
    httpx transport and the direct calls."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._limits = limits
        self._session: aiohttp.ClientSession | None = None

    def __call__(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._limits.max_connections or 0,
                keepalive_timeout=self._limits.keepalive_expiry or KEEPALIVE_S,
                ssl=httpx.create_ssl_context(trust_env=False),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                auto_decompress=True,
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()


def upstream_client(settings: Settings) -> UpstreamClient:
    """The HTTP client of upstream calls: httpx's API over aiohttp's connection pool, plus
    that pool directly. httpcore's pool checks every idle connection on each request (a
    `poll` per connection), which under 32 concurrent calls took 45% of the ingress CPU;
    aiohttp's pool does not."""
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS, keepalive_expiry=KEEPALIVE_S)
    session = _Session(limits)
    return UpstreamClient(
        session=session,
        transport=AiohttpTransport(limits=limits, trust_env=False, client=session),
        timeout=httpx.Timeout(
            settings.provider_timeout_s, connect=settings.provider_connect_timeout_s
        ),
        trust_env=False,
    )


@functools.lru_cache(maxsize=64)
def _aiohttp_timeout(
    connect: float | None, read: float | None, pool: float | None
) -> aiohttp.ClientTimeout:
    # httpx's timeouts are per operation, none of them a total; the same mapping as the
    # httpx transport over aiohttp uses.
    return aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read, connect=pool)


def client_timeout(
    timeout: httpx.Timeout | float | None, default: httpx.Timeout
) -> aiohttp.ClientTimeout:
    t = default if timeout is None else httpx.Timeout(timeout)
    return _aiohttp_timeout(t.connect, t.read, t.pool)


def transport_error(provider: str, exc: aiohttp.ClientError) -> ProviderError:
    """What a failed call was, for the caller: no answer in time, or no answer at all."""
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return ProviderError.timeout(provider, f"timed out ({type(exc).__name__})")
    return ProviderError.unreachable(provider, f"{type(exc).__name__}: {exc}")


def _headers(headers: Mapping[str, str]) -> Mapping[str, str]:
    if isinstance(headers, httpx.Headers):
        return dict(headers.multi_items())
    return headers


class UpstreamResponse:
    """An aiohttp response seen through the part of `httpx.Response` the adapters use."""

    __slots__ = ("_content", "_raw", "headers", "status_code")

    def __init__(self, raw: aiohttp.ClientResponse) -> None:
        self._raw = raw
        self.status_code = raw.status
        self.headers = raw.headers  # case-insensitive, like httpx's
        self._content: bytes | None = None

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise httpx.ResponseNotRead()
        return self._content

    async def aread(self) -> bytes:
        if self._content is None:
            self._content = await self._raw.read()
        return self._content

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        if self._content is not None:
            yield self._content
            return
        async for chunk in self._raw.content.iter_any():
            yield chunk

    async def aiter_lines(self) -> AsyncIterator[str]:
        """UTF-8 text lines, split on CRLF, LF or CR, without their ending."""
        async for line in utf8_lines(self.aiter_bytes()):
            yield line


async def utf8_lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    """The lines of a body that arrives in byte pieces cut anywhere (inside a multi-byte
    character too), decoded as UTF-8 whatever the Content-Type says (see the module
    docstring); an invalid byte becomes U+FFFD rather than failing the stream. A leading
    byte-order mark is dropped, as the SSE specification's UTF-8 decode does."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")("replace")
    lines = LineSplitter()
    async for chunk in chunks:
        for line in lines.feed(decoder.decode(chunk)):
            yield line
    for line in lines.feed(decoder.decode(b"", final=True)) + lines.close():
        yield line


class LineSplitter:
    """Text fed in pieces, out in lines: split on CRLF, LF or CR (the SSE spec's line ends,
    and httpx's), without their ending. A CR at the end of a piece waits for the next one,
    which may start with its LF."""

    _END = re.compile(r"\r\n|\r|\n")

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, text: str) -> list[str]:
        pending = self._pending + text
        held = ""
        if pending.endswith("\r"):
            pending, held = pending[:-1], "\r"
        lines = self._END.split(pending)
        self._pending = lines.pop() + held
        return lines

    def close(self) -> list[str]:
        """The last line: one not ended, or one ended by a held CR."""
        pending, self._pending = self._pending, ""
        if not pending:
            return []
        return [pending.removesuffix("\r")]


async def post(
    session: aiohttp.ClientSession,
    provider: str,
    url: str | httpx.URL,
    content: bytes,
    headers: Mapping[str, str],
    limits: aiohttp.ClientTimeout,
) -> UpstreamResponse:
    """POST `content` and read the whole answer; a transport failure is a ProviderError."""
    try:
        async with session.post(
            str(url),
            data=content,
            headers=_headers(headers),
            timeout=limits,
            allow_redirects=False,
        ) as raw:
            response = UpstreamResponse(raw)
            await response.aread()
            return response
    except aiohttp.ClientError as exc:
        raise transport_error(provider, exc) from exc


@contextlib.asynccontextmanager
async def stream(
    session: aiohttp.ClientSession,
    provider: str,
    method: str,
    url: str | httpx.URL,
    content: bytes | None,
    headers: Mapping[str, str],
    limits: aiohttp.ClientTimeout,
) -> AsyncIterator[UpstreamResponse]:
    """A request whose body the caller reads; transport failures while it does are
    ProviderErrors too."""
    try:
        async with session.request(
            method,
            str(url),
            data=content,
            headers=_headers(headers),
            timeout=limits,
            allow_redirects=False,
        ) as raw:
            yield UpstreamResponse(raw)
    except aiohttp.ClientError as exc:
        raise transport_error(provider, exc) from exc
