"""The address guard: which hosts the server may connect to on a client's behalf (job sources,
``/v1/analyze`` URIs, job callbacks), and an HTTP transport that connects only to what it checked.

One rule for every outbound request a client can cause: the host is resolved and refused when
**any** of its addresses is loopback, private, link-local, multicast, reserved, unspecified or
otherwise not globally routable (:func:`address_refusal`). IPv6 forms that carry an IPv4 address
(IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, 6to4 ``2002::/16``, Teredo
``2001::/32``, NAT64 ``64:ff9b::/96``) are judged by the IPv4 address inside. The odd spellings of
an IPv4 address (``0x7f.1``, ``2130706433``, ``0177.0.0.1``, ``127.1``) are resolved by the same
``getaddrinfo`` the connection uses, so they are judged by the address they mean.

Checking a name and then letting the HTTP client resolve it again would allow DNS rebinding (a
public answer to the check, a loopback answer to the connect). :class:`GuardedTransport` closes
that gap: its connect step resolves and checks the host itself and connects to the vetted
address, while the request keeps the original ``Host`` header and TLS server name (SNI and the
certificate check use the URL's host). Every connection is checked this way, so every redirect
hop is checked too. Proxies from the environment are ignored (a proxy would connect instead).

``allow_private=True`` (``--sources-allow-private``, ``--callbacks-allow-private``) lets a
trusted deployment reach its own network; the scheme and host checks still apply.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpcore
import httpx

from frameserve.errors import AddressRefusedError

__all__ = ["AddressGuard", "GuardedTransport", "address_refusal", "embedded_ipv4"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052 well-known prefix
_COMPAT = ipaddress.ip_network("::/96")  # RFC 4291 2.5.5.1, deprecated IPv4-compatible
# IANA special-purpose blocks "not globally reachable" that Python 3.11's tables miss
_NOT_GLOBAL_V4 = (ipaddress.ip_network("192.0.0.0/24"),)  # IETF protocol assignments (RFC 6890)
_NOT_GLOBAL_V6 = (ipaddress.ip_network("64:ff9b:1::/48"),)  # local-use NAT64 (RFC 8215)


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries, or ``None``: IPv4-mapped, IPv4-compatible
    (``::a.b.c.d``, not ``::`` or ``::1``), 6to4 (RFC 3056), NAT64 well-known prefix (RFC 6052)
    and Teredo (RFC 4380; the client's address, the server's is checked by :func:`address_refusal`)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if ip in _NAT64 or (ip in _COMPAT and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _flagged(
    ip: IPAddress, not_global: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network], last: tuple[str, bool]
) -> str | None:
    """The checks both address families share, in order: a block of ``not_global``, then the
    ``ipaddress`` flags (``last``: the family's own final one); the first reason, or ``None``."""
    if any(ip in net for net in not_global):
        return "not globally routable"
    for what, flag in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        last,
    ):
        if flag:
            return what
    return None


def _v4_refusal(ip: ipaddress.IPv4Address) -> str | None:
    why = _flagged(ip, _NOT_GLOBAL_V4, ("reserved", ip.is_reserved))
    if why is not None:
        return why
    return None if ip.is_global else "not globally routable"


def address_refusal(ip: IPAddress) -> str | None:
    """Why ``ip`` may not be connected to on a client's behalf (``"loopback"``, ``"private"``,
    ``"link-local"``, ``"multicast"``, ``"reserved"``, ``"unspecified"``, ``"not globally
    routable"``), or ``None`` for a public address. Python's ``ipaddress`` flags (the IANA
    special-purpose registries) decide; IPv6 addresses carrying an IPv4 address are judged by it."""
    if isinstance(ip, ipaddress.IPv4Address):
        return _v4_refusal(ip)
    inner = embedded_ipv4(ip)
    if inner is not None:
        why = _v4_refusal(inner)
        if ip.teredo is not None and why is None:
            why = _v4_refusal(ip.teredo[0])
        if why is not None:
            return f"{why} (IPv4 {inner} inside)"
        if ip.ipv4_mapped is not None or ip in _NAT64:
            return None  # the IPv4 address is what is reached
        if ip in _COMPAT:
            return "reserved (IPv4-compatible IPv6 address)"
    why = _flagged(ip, _NOT_GLOBAL_V6, ("site-local", ip.is_site_local))
    if why is not None:
        return why
    if ip.is_reserved and inner is None:
        return "reserved"
    return None if ip.is_global else "not globally routable"


def _resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (``getaddrinfo``, TCP), in the resolver's order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    seen: list[str] = []
    for info in infos:
        addr = str(info[4][0]).split("%")[0]
        if addr not in seen:
            seen.append(addr)
    return seen


@dataclass(frozen=True)
class AddressGuard:
    """Resolves and vets hosts for outbound requests.

    Attributes:
        allow_private: accept non-public addresses (trusted setups).
        what: what the URL is, for messages (``"source"``, ``"callback_url"``).
        flag: the flag that allows private addresses, named in refusals.
        resolver: ``(host, port) -> [address]`` (default: ``getaddrinfo``).
    """

    allow_private: bool = False
    what: str = "url"
    flag: str = "--sources-allow-private"
    resolver: Callable[[str, int], list[str]] | None = None

    def check_url(self, url: str, shown: str | None = None) -> list[str]:
        """Check an ``http(s)://host[:port]/...`` URL; returns the vetted addresses of its host.

        Args:
            url: the URL.
            shown: how to name it in messages (a redacted form), default ``url``.

        Raises:
            AddressRefusedError: another scheme, no host, a host that does not resolve, or (unless
                :attr:`allow_private`) any address of it not public.
        """
        label = url if shown is None else shown
        try:
            parts = urlsplit(url)  # ValueError: a bad IPv6 literal ("http://[::1")
            port = parts.port
        except ValueError:
            raise AddressRefusedError(
                f"{self.what} {label!r} is not a valid URL (its host or port does not parse)"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise AddressRefusedError(f"{self.what} {label!r} must be an http:// or https:// URL with a host")
        return self.resolve(parts.hostname, port or (443 if parts.scheme == "https" else 80), label)

    def resolve(self, host: str, port: int, label: str | None = None) -> list[str]:
        """Resolve ``host`` and vet every address; returns them (the ones to connect to).

        Raises:
            AddressRefusedError: the host does not resolve, or an address is not public (unless
                :attr:`allow_private`).
        """
        name = label if label is not None else host
        host = host.strip("[]")
        try:
            found = (self.resolver or _resolve)(host, port)
        except (OSError, UnicodeError) as exc:
            raise AddressRefusedError(f"{self.what} host {host!r} does not resolve: {exc}") from None
        if not found:
            raise AddressRefusedError(f"{self.what} host {host!r} does not resolve")
        vetted: list[str] = []
        for text in found:
            try:
                ip = ipaddress.ip_address(text)
            except ValueError:
                raise AddressRefusedError(
                    f"{self.what} host {host!r} resolved to {text!r}, not an IP address"
                ) from None
            if not self.allow_private:
                why = address_refusal(ip)
                if why is not None:
                    raise AddressRefusedError(
                        f"{self.what} {name!r} resolves to non-public address {ip} ({why}); allow it with {self.flag}"
                    )
            vetted.append(str(ip))
        return vetted


@dataclass
class _Streams:
    """The sockets one transport opened, so another thread can cut them (:meth:`GuardedTransport.abort`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    sockets: list[socket.socket] = field(default_factory=list)
    aborted: bool = False

    def add(self, sock: Any) -> None:
        with self.lock:
            if isinstance(sock, socket.socket):
                self.sockets.append(sock)
            if self.aborted:
                _shutdown(sock)

    def abort(self) -> None:
        with self.lock:
            self.aborted = True
            for sock in self.sockets:
                _shutdown(sock)


def _shutdown(sock: Any) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)  # a blocked recv in another thread returns at once
    except OSError:
        pass


class _GuardedBackend(httpcore.NetworkBackend):
    """httpcore's sync backend, connecting only to addresses the guard vetted for the host."""

    def __init__(self, guard: AddressGuard, streams: _Streams) -> None:
        self.guard = guard
        self.streams = streams
        self.inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        if self.streams.aborted:
            raise httpcore.ConnectError("the request was aborted")
        last: Exception | None = None
        for addr in self.guard.resolve(host, port):  # raises AddressRefusedError
            try:
                stream = self.inner.connect_tcp(
                    addr, port, timeout=timeout, local_address=local_address, socket_options=socket_options
                )
            except httpcore.ConnectError as exc:
                last = exc
                continue
            self.streams.add(stream.get_extra_info("socket"))
            return stream
        assert last is not None
        raise last

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not reachable through the address guard")

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class GuardedTransport(httpx.HTTPTransport):
    """An ``httpx`` transport whose every connection goes to an address :class:`AddressGuard`
    vetted for that host at connect time (pinned: no second resolution), with the URL's host as
    ``Host`` and TLS server name. Environment proxies are not used.

    Args:
        guard: the guard to vet hosts with.
        verify: TLS verification (``httpx`` semantics).

    :meth:`abort` (from any thread) shuts down every socket the transport opened, so a read
    blocked in another thread fails at once; later connects fail too.
    """

    def __init__(self, guard: AddressGuard, *, verify: Any = True) -> None:
        ssl_context = httpx.create_ssl_context(verify=verify, trust_env=False)
        super().__init__(verify=ssl_context, trust_env=False)
        self.guard = guard
        self._streams = _Streams()
        self._pool = httpcore.ConnectionPool(  # the parent's pool, with the guarded backend
            ssl_context=ssl_context,
            max_connections=10,
            max_keepalive_connections=5,
            keepalive_expiry=5.0,
            network_backend=_GuardedBackend(guard, self._streams),
        )

    def abort(self) -> None:
        """Cut every connection of this transport now; later requests fail."""
        self._streams.abort()
