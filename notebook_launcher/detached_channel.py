"""A kernel's connection to a detached run's socket (``detached.DetachedRun`` follows the run's status on one, each
shown panel has one of its own): the messages, read by a thread of this kernel."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from .schema.detached_files import MessageReader, message, socket_address
from .schema.events import Event

IDLE_S = 0.25  # a panel fed by a connection is looked at this often while the run says nothing


class Follower:
    """One connection to a run's socket, read by a thread: each message to ``on_message``, then ``on_end()``;
    ``on_idle()``, where given, every ``IDLE_S`` without a message, on the same thread (a panel's ``tick``: it
    answers a page that asked for the state, and moves the output's clock, while the ranks are quiet)."""

    def __init__(self, connection: socket.socket, on_message, on_end, on_idle=None):
        self.connection = connection
        self._on_message, self._on_end, self._on_idle = on_message, on_end, on_idle
        if on_idle is not None:
            connection.settimeout(IDLE_S)
        self.thread = threading.Thread(target=self._read, daemon=True, name="detached-run")
        self.thread.start()

    def _read(self) -> None:
        reader = MessageReader()
        try:
            while True:
                try:
                    data = self.connection.recv(1 << 20)
                except TimeoutError:
                    self._on_idle()
                    continue
                if not data:
                    break
                for header, attachment in reader.feed(data):
                    self._on_message(header, attachment)
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                self.connection.close()
            self._on_end()

    def send(self, header: dict) -> None:
        self.connection.sendall(message(header))


def connect(run_dir: str) -> socket.socket | None:
    """A connection to the run's supervisor; None where nothing listens (the run has ended, or was lost)."""
    folder = os.open(run_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(socket_address(folder))
    except (FileNotFoundError, ConnectionRefusedError):
        connection.close()
        return None
    finally:
        os.close(folder)
    return connection


def as_event(header: dict, attachment: bytes) -> Event:
    rank, seq, when, kind, data = header["event"]
    return Event(rank, seq, when, kind, data, attachment)
