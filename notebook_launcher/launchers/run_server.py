"""The live channel of a detached run: a Unix socket in its run folder (owner-only) that any kernel of the same
user connects to. Each client gets the run's description, every message so far (the full state, as the panel
folds it), then what follows, written by a thread of its own so that a slow or vanished client never holds the
run; what a client sends is read only for a stop request."""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
import time

from ..schema.detached_files import MessageReader, message, peer_uid, socket_address
from ..schema.events import LOG, STREAM

MAX_KEPT_BYTES = 64 * 2**20  # the lines kept for clients that attach later (the run log keeps every one)
_SEND_CHUNK = 1 << 20
_CAUGHT_UP = message({"caught_up": True})


class _Client:
    def __init__(self, connection: socket.socket, hello: bytes, caught_up_at: int):
        self.connection = connection
        self.position = 0  # the next message of the backlog it gets
        self.caught_up_at = caught_up_at  # after this many, it has the state as it was when it came: it is told so
        self.pending = bytearray(hello)
        self.reader = MessageReader()


class RunServer:
    """``publish(header, attachment)`` from the run's thread; the clients are served by a thread of this one."""

    def __init__(self, folder_fd: int, hello: dict, on_stop):
        self._hello = message({"hello": hello})
        self._on_stop = on_stop
        self._backlog: list[bytes] = []
        self._kept = 0
        self._lines_left_out = False
        self._lock = threading.Lock()
        self._clients: dict[socket.socket, _Client] = {}
        self._closing = False
        self._address = socket_address(folder_fd)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        previous = os.umask(0o177)  # the socket is born 0600
        try:
            self._listener.bind(self._address)
        finally:
            os.umask(previous)
        self._listener.listen(16)
        self._listener.setblocking(False)
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        os.register_at_fork(after_in_child=self._forget)  # a rank holds none of the channel's descriptors
        self._thread = threading.Thread(target=self._serve, daemon=True, name="run-channel")
        self._thread.start()

    @property
    def clients(self) -> int:
        return len(self._clients)

    def publish(self, header: dict, attachment: bytes = b"", kind: str = "") -> None:
        data = message(header, attachment)
        with self._lock:
            if kind in (STREAM, LOG) and self._kept + len(data) > MAX_KEPT_BYTES:
                if not self._lines_left_out:
                    self._lines_left_out = True
                    self._backlog.append(message({"note": "the live channel keeps no more lines of this run: "
                                                          "the run log has every one (inspect_run)"}))
                return
            self._kept += len(data)
            self._backlog.append(data)
        self._wake()

    def close(self, drain_s: float = 5.0) -> None:
        """Every client gets what was published (for up to ``drain_s``), then the socket is gone."""
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and any(
                client.pending or client.position < len(self._backlog) for client in list(self._clients.values())):
            time.sleep(0.02)
        self._closing = True
        self._wake()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.unlink(self._address)

    def _forget(self) -> None:
        for item in (self._listener, *self._clients):
            with contextlib.suppress(OSError):
                item.close()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the serving thread ---------------------------------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_write, b"x")

    def _serve(self) -> None:
        while not self._closing:
            for key, _ in self._selector.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError, OSError):
                        os.read(self._wake_read, 4096)
                else:
                    self._read(key.fileobj)
            for client in list(self._clients.values()):
                self._flush(client)
        for connection in list(self._clients):
            self._drop(connection)
        self._selector.close()
        self._listener.close()
        os.close(self._wake_read)
        os.close(self._wake_write)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError, OSError):
                return
            try:
                stranger = peer_uid(connection) != os.getuid()  # (0600 socket, 0700 folder: never, unless root)
            except OSError:
                stranger = True
            if stranger:
                connection.close()
                continue
            connection.setblocking(False)
            with self._lock:
                self._clients[connection] = _Client(connection, self._hello, len(self._backlog))
            self._selector.register(connection, selectors.EVENT_READ, "client")

    def _read(self, connection: socket.socket) -> None:
        client = self._clients.get(connection)
        if client is None:
            return
        try:
            data = connection.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(connection)  # a client that went away: the run goes on
            return
        try:
            requests = client.reader.feed(data)
        except ValueError:
            self._drop(connection)
            return
        if any(header.get("stop") for header, _ in requests):
            self._on_stop()

    def _flush(self, client: _Client) -> None:
        while True:
            while len(client.pending) < _SEND_CHUNK and client.position < len(self._backlog):
                if client.position == client.caught_up_at:
                    client.pending += _CAUGHT_UP
                client.pending += self._backlog[client.position]
                client.position += 1
            if client.position == client.caught_up_at:
                client.pending += _CAUGHT_UP
                client.caught_up_at = -1
            if not client.pending:
                return
            try:
                sent = client.connection.send(client.pending)
            except (BlockingIOError, InterruptedError):
                self._want_write(client, True)
                return
            except OSError:
                self._drop(client.connection)
                return
            del client.pending[:sent]
            self._want_write(client, False)

    def _want_write(self, client: _Client, wanted: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if wanted else 0)
        with contextlib.suppress(KeyError, ValueError):
            if self._selector.get_key(client.connection).events != events:
                self._selector.modify(client.connection, events, "client")

    def _drop(self, connection: socket.socket) -> None:
        self._clients.pop(connection, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection)
        connection.close()
