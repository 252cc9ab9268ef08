"""The ports ``serve --http-workers N`` shares between its processes: the owner reserves each one
with a bound socket (``SO_REUSEPORT``, never listening), and every front end listens on it with
a socket of its own; the kernel spreads new connections over the listeners (``socket(7)``)."""

from __future__ import annotations

import socket

__all__ = ["bind_reuseport", "listen_reuseport"]


def bind_reuseport(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT`` (port 0: any free one), not yet
    listening: the owner's reservation of a port and each front end's listener are such sockets."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if host == "::" else 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def listen_reuseport(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` sharing the port (``SO_REUSEPORT``) with the
    owner's reservation and the other front ends."""
    sock = bind_reuseport(host, port)
    try:
        sock.listen(2048)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
