"""http(s) image URLs, fetched only where IMAGE_URL_FETCH=on, and never from a private network.

Every hop (the URL and each redirect) resolves its host here, checks every address it resolves to, and
connects to a checked address, so neither a redirect nor a DNS answer that changes between check and
connect reaches the engine's hosts or the LAN. httpcore2 is imported on the first fetch: it takes half a
second, and the API must restart in well under one.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urljoin, urlsplit

import anyio

MAX_REDIRECTS = 3
_REDIRECTS = (301, 302, 303, 307, 308)
_HEADERS = [(b"Accept", b"image/png, image/jpeg, image/webp, image/gif"), (b"User-Agent", b"mlx-cluster-serve")]


class FetchRefused(Exception):
    """The URL was not fetched; the message says why (the caller names the field)."""


def address_problem(address: str, allow_loopback: bool = False, own: Iterable[str] = ()) -> str | None:
    """Why an image may not be fetched from address ("a private address", ...), or None when it is public."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 zone ("fe80::1%en0") names no other host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:  # before the engine's hosts: the tests' stack runs them on 127.0.0.1
        return None if allow_loopback else "a loopback address"
    if str(ip) in own:
        return "an address of this server's engine hosts"
    for name in ("link_local", "multicast", "reserved", "unspecified", "private"):
        if getattr(ip, f"is_{name}"):
            return f"a {name.replace('_', '-')} address"
    return None if ip.is_global else "a non-public address"


async def fetch_image(url: str, *, max_bytes: int, timeout: float, allow_loopback: bool = False,
                      own_hosts: Iterable[str] = ()) -> bytes:
    """The body of a GET of url (following at most MAX_REDIRECTS redirects) within timeout seconds and
    max_bytes; raises FetchRefused."""
    import httpcore2

    own = await _addresses_of(own_hosts)
    backend = _GuardedBackend(httpcore2.AnyIOBackend(), allow_loopback, own)
    try:
        with anyio.fail_after(timeout):
            async with httpcore2.AsyncConnectionPool(network_backend=backend, retries=0) as pool:
                for _ in range(MAX_REDIRECTS + 1):
                    _check_url(url)
                    async with pool.stream("GET", url, headers=_HEADERS) as response:
                        if response.status not in _REDIRECTS:
                            return await _body(response, max_bytes)
                        location = _header(response.headers, b"location")
                        if not location:
                            raise FetchRefused(f"the image URL answered HTTP {response.status} without a Location")
                        url = urljoin(url, location)
                raise FetchRefused(f"the image URL redirected more than {MAX_REDIRECTS} times")
    except TimeoutError:
        raise FetchRefused(f"the image URL did not answer within {timeout:g} s (IMAGE_URL_TIMEOUT)") from None
    except (httpcore2.NetworkError, httpcore2.TimeoutException, httpcore2.ProtocolError,
            httpcore2.UnsupportedProtocol, OSError, ValueError) as exc:
        raise FetchRefused(f"the image URL could not be fetched ({type(exc).__name__}: {str(exc)[:120]})") from None


def _check_url(url: str) -> None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise FetchRefused("the image URL is not a valid URL") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        shown = url if len(url) <= 60 else url[:57] + "..."
        raise FetchRefused(f"the image URL (or a redirect) leads to {shown!r}, which has no host or is not http(s); "
                           "only http(s) URLs are fetched")


async def _body(response: Any, max_bytes: int) -> bytes:
    if response.status != 200:
        raise FetchRefused(f"the image URL answered HTTP {response.status}")
    declared = _header(response.headers, b"content-length")
    if declared.isdigit() and int(declared) > max_bytes:
        raise FetchRefused(f"the image at the URL has {declared} bytes, more than this server's limit of "
                           f"{max_bytes} (MAX_IMAGE_BYTES)")
    chunks, size = [], 0
    async for chunk in response.aiter_stream():
        size += len(chunk)
        if size > max_bytes:
            raise FetchRefused(f"the image at the URL is larger than this server's limit of {max_bytes} bytes "
                               "(MAX_IMAGE_BYTES)")
        chunks.append(chunk)
    return b"".join(chunks)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    return next((v.decode("latin-1").strip() for k, v in headers if k.lower() == name), "")


async def _addresses_of(hosts: Iterable[str]) -> frozenset[str]:
    out: set[str] = set()
    for host in hosts:
        try:
            out.update(str(info[4][0]) for info in await anyio.getaddrinfo(host, None, type=socket.SOCK_STREAM))
        except OSError:
            continue  # a host that does not resolve here has no address to protect from here
    return frozenset(out)


class _GuardedBackend:
    """httpcore2's network backend that connects only to a checked address of the host asked for."""

    def __init__(self, inner: Any, allow_loopback: bool, own: frozenset[str]) -> None:
        self._inner, self._allow_loopback, self._own = inner, allow_loopback, own

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> Any:
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise FetchRefused(f"the image URL's host {host!r} does not resolve ({exc})") from None
        addresses = [str(info[4][0]) for info in infos]
        for address in addresses:
            problem = address_problem(address, self._allow_loopback, self._own)
            if problem:
                raise FetchRefused(f"the image URL's host {host!r} resolves to {address}, {problem}; this server "
                                   "fetches images only from public addresses")
        return await self._inner.connect_tcp(addresses[0], port, timeout, local_address, socket_options)

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> Any:
        raise FetchRefused("the image URL names a Unix socket")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
