"""The port for rank 0's store, held by the kernel from before any worker starts until rank 0 serves on it."""

from __future__ import annotations

import errno
import socket


class PortReservation:
    """A listening socket the kernel holds for one launch attempt; rank 0's TCPStore serves on it.

    Binding in the kernel, before any worker starts, means no other program (or another notebook's launch) can
    take the port between our check and rank 0's bind, and peers that connect before rank 0 is ready wait in
    the listen backlog instead of retrying. The store server itself runs in rank 0, never in the kernel.
    """

    def __init__(self, host: str, requested: int):
        self.note = ""
        try:
            self.socket = _listen(host, requested)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise  # not an address of this machine
            self.socket = _listen(host, 0)
            self.note = f"port {requested} is busy, using {self.socket.getsockname()[1]}"
        self.port = self.socket.getsockname()[1]

    def fileno(self) -> int:
        return self.socket.fileno()

    def close(self) -> None:
        self.socket.close()


def _listen(host: str, port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a just-finished run's port is fine
        listener.bind((host, port))
        listener.listen(1024)  # a second program that bound the same port too fails here, not later
    except OSError:
        listener.close()
        raise
    return listener


def reserve_port(host: str, requested: int) -> PortReservation | None:
    """The requested port if it is free, else any free one, held until the workers have started; None when
    ``host`` is not an address of this machine (the port is then used as given)."""
    try:
        return PortReservation(host, requested)
    except socket.gaierror:
        return None
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            return None
        raise
