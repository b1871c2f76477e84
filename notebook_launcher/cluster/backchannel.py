"""The connection each agent started by mpirun opens back to the kernel, and how both ends prove themselves.

Over SSH an agent's stdin and stdout are the SSH session, already authenticated. mpirun gives no such channel,
so each agent connects back to a port the kernel opens for the run, a port others can reach too. Hence:

- the kernel listens only on the address the hosts reach it on (``listen_address``), not on every interface;
- connections that have not proven themselves are non-blocking entries in the kernel's selector, each with
  ``HANDSHAKE_S`` and ``HELLO_MAX`` bytes to do it, then closed: idle or hostile connections never hold the
  kernel's loop, nor keep the real agents out;
- both ends prove they hold the node's key (derived from the run's secret, which an agent gets through
  mpirun's environment, never over this connection). The kernel sends a fresh challenge; the agent answers with
  its node rank, a challenge of its own and HMAC(key, "agent" || both challenges); the kernel answers with
  HMAC(key, "kernel" || both), which the agent checks before it reads anything else;
- everything the kernel sends after that (the settings, the pickled function, the control lines) comes in
  messages carrying an HMAC over both challenges, a counter and the bytes, checked by the agent before it uses
  them: an agent never unpickles what does not come from its run's kernel. Authenticated, not encrypted.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
import selectors
import socket
import struct
import time

from .agent_channel import node_key
from .remote import without_user

HANDSHAKE_S = 2.0  # an agent answers the challenge at once; a stranger is closed after this
HELLO_MAX = 256  # the agent's answer is ~150 bytes; a connection that says more is not an agent
MAX_PENDING = 256  # connections still to prove themselves; beyond, the oldest is closed
_CHALLENGE = b"NOTEBOOK-LAUNCHER-KERNEL/1 "
_NONCE_BYTES = 16
_HEADER = struct.Struct(">Q32s")  # a message: [u64 length][HMAC-SHA256][bytes]


class ChannelRefused(Exception):
    """The other end did not prove it holds the run's key, or a message of it was not signed with it."""


def listen_address(hosts: list[str]) -> str:
    """The address the hosts reach this kernel on: the interface that routes to the first host not reached on
    loopback (when every host is on loopback, the loopback address that node 0 is reached on); this machine's name
    when no host resolves here."""
    from .rendezvous import advertised_address

    first = None
    for host in hosts:
        name = without_user(host)
        address = advertised_address(f"[{name}]:1" if ":" in name else f"{name}:1")
        if _is_address(address) and not ipaddress.ip_address(address.split("%")[0]).is_loopback:
            return address
        first = first or address
    if _is_address(first):
        return first
    return first  # this machine's name (no host resolves here, e.g. SSH aliases): BackChannel binds every interface


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return False
    return True


class Session:
    """One proven connection: the kernel seals what it sends, the agent opens it (each message once, in order)."""

    def __init__(self, key: bytes, kernel_nonce: bytes, agent_nonce: bytes):
        self._key = key
        self._nonces = kernel_nonce + agent_nonce
        self._counter = 0

    def proof(self, side: bytes) -> str:
        return hmac.new(self._key, side + self._nonces, "sha256").hexdigest()

    def _mac(self, body: bytes) -> bytes:
        self._counter += 1
        return hmac.new(self._key, b"message" + self._nonces + self._counter.to_bytes(8, "big") + body,
                        "sha256").digest()

    def seal(self, body: bytes) -> bytes:
        return _HEADER.pack(len(body), self._mac(body)) + body

    def receive(self, fd: int) -> bytes:
        """The next message's bytes, checked (b"" at the end of the connection)."""
        header = _read_exactly(fd, _HEADER.size)
        if len(header) < _HEADER.size:
            return b""
        length, mac = _HEADER.unpack(header)
        body = _read_exactly(fd, length)
        if len(body) < length or not hmac.compare_digest(mac, self._mac(body)):
            raise ChannelRefused("a message on the connection to the kernel is not signed with this run's key (or "
                                 "is out of order): refused before reading it")
        return body


def _read_exactly(fd: int, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        try:
            chunk = os.read(fd, min(size - len(data), 1 << 20))
        except OSError:  # reset: the same as its end
            chunk = b""
        if not chunk:
            break
        data += chunk
    return bytes(data)


class _Pending:
    def __init__(self, nonce: bytes):
        self.nonce = nonce
        self.deadline = time.monotonic() + HANDSHAKE_S
        self.said = bytearray()


class BackChannel:
    """Kernel side: the listening socket and the connections still to prove themselves, in ``selector``.

    ``accept()`` when the listener is readable, ``hello(connection)`` when a pending connection is (it returns
    ``(node_rank, connection, session)`` once an agent has proven itself), ``expire()`` now and then."""

    def __init__(self, address: str, secret: bytes, num_nodes: int, selector: selectors.BaseSelector):
        self._secret = secret
        self._num_nodes = num_nodes
        self._selector = selector
        self._pending: dict[socket.socket, _Pending] = {}
        self._proven: set[int] = set()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        # an address: only that interface; a name (no route to any host was found here): every interface, the
        # agents being told the name (the handshake, not the address, keeps strangers out)
        self.listener = socket.create_server((address if _is_address(address) else "", 0), family=family,
                                             backlog=64)
        self.listener.setblocking(False)
        selector.register(self.listener, selectors.EVENT_READ, (None, "accept"))
        self.address, self.port = address, self.listener.getsockname()[1]

    def accept(self) -> None:
        for _ in range(64):  # whatever waits, without starving the rest of the loop
            try:
                connection, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors, or the peer gave up already
                return
            connection.setblocking(False)
            pending = _Pending(secrets.token_bytes(_NONCE_BYTES))
            try:
                connection.send(_CHALLENGE + pending.nonce.hex().encode() + b"\n")  # a few bytes: never blocks
            except OSError:
                connection.close()
                continue
            self._pending[connection] = pending
            self._selector.register(connection, selectors.EVENT_READ, (None, "hello"))
            if len(self._pending) > MAX_PENDING:
                self._drop(next(iter(self._pending)))

    def hello(self, connection: socket.socket):
        """Read what a pending connection said; an agent's answer, once verified, makes it the node's channel."""
        pending = self._pending.get(connection)
        if pending is None:
            return None
        try:
            chunk = connection.recv(HELLO_MAX + 1 - len(pending.said))
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            chunk = b""
        pending.said += chunk
        if not chunk or len(pending.said) > HELLO_MAX:
            self._drop(connection)
            return None
        if b"\n" not in pending.said:
            return None
        try:
            rank_text, agent_nonce, proof = pending.said.split(b"\n", 1)[0].decode("ascii").split(" ")
            node_rank, agent_nonce = int(rank_text), bytes.fromhex(agent_nonce)
            if not 0 <= node_rank < self._num_nodes or node_rank in self._proven or len(agent_nonce) != _NONCE_BYTES:
                raise ValueError("not an agent of this run")
            session = Session(node_key(self._secret, node_rank), pending.nonce, agent_nonce)
            if not hmac.compare_digest(proof, session.proof(b"agent")):
                raise ValueError("not an agent of this run")
        except ValueError:  # (UnicodeDecodeError is one)
            self._drop(connection)  # never a byte of the run to it
            return None
        self._selector.unregister(connection)
        del self._pending[connection]
        self._proven.add(node_rank)
        return node_rank, connection, session

    def expire(self) -> None:
        now = time.monotonic()
        for connection in [c for c, pending in self._pending.items() if now > pending.deadline]:
            self._drop(connection)

    def _drop(self, connection: socket.socket) -> None:
        del self._pending[connection]
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection)
        connection.close()

    def close(self) -> None:
        for connection in list(self._pending):
            self._drop(connection)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self.listener)
        self.listener.close()


def connect(address: str, port: int, secret: bytes, node_rank: int, timeout: float = 30) -> tuple[int, Session]:
    """Agent side: connect to the kernel, answer its challenge and check its proof. Returns the connection's fd
    (blocking) and the session that checks the kernel's messages."""
    try:
        connection = socket.create_connection((address, port), timeout=timeout)
    except OSError as exc:
        raise ChannelRefused(f"cannot reach the kernel at {address}:{port} ({exc})") from None
    try:
        line = _read_line(connection)
        if not line.startswith(_CHALLENGE):
            raise ChannelRefused(f"{address}:{port} is not a notebook_launcher kernel (it said {line[:60]!r})")
        kernel_nonce = bytes.fromhex(line[len(_CHALLENGE):].decode("ascii", "replace").strip() or "x")
        agent_nonce = secrets.token_bytes(_NONCE_BYTES)
        session = Session(node_key(secret, node_rank), kernel_nonce, agent_nonce)
        connection.sendall(f"{node_rank} {agent_nonce.hex()} {session.proof(b'agent')}\n".encode())
        if not hmac.compare_digest(_read_line(connection).strip(), session.proof(b"kernel").encode()):
            raise ChannelRefused(f"the kernel at {address}:{port} did not prove it holds this run's key: nothing "
                                 f"it sends is read")
    except (ValueError, OSError) as exc:
        connection.close()
        raise ChannelRefused(f"no kernel's challenge from {address}:{port} ({type(exc).__name__}: {exc})") from None
    except BaseException:
        connection.close()
        raise
    connection.settimeout(None)
    return connection.detach(), session


def _read_line(connection: socket.socket) -> bytes:
    """One line, byte by byte: nothing after it is taken from the socket (the messages that follow)."""
    line = bytearray()
    while len(line) <= HELLO_MAX and not line.endswith(b"\n"):
        byte = connection.recv(1)
        if not byte:
            break
        line += byte
    return bytes(line)
