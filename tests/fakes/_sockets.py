"""A loopback socket for a fake server, bound before the server starts."""

from __future__ import annotations

import socket


def bound_socket() -> socket.socket:
    """A socket bound to a free port of 127.0.0.1, for `uvicorn.Server.run(sockets=[...])`.
    Binding it here and keeping it open (instead of asking for a free port, closing it and
    letting uvicorn bind the number later) leaves no window in which another server of the
    same test run takes the port: seen as 'address already in use' in a full run."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock
