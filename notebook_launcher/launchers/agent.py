"""One host's part of a launch across hosts (``notebook_launcher(..., hosts=[...])``).

The launching kernel starts ``python -m notebook_launcher.launchers.agent`` on each host over SSH (or with mpirun or
srun, one agent per host, each connecting back to the kernel with ``--connect``: then that connection carries what stdin
and stdout carry over SSH, once both ends have proven they hold the run's key, and each message from the kernel
is checked before it is read: ``backchannel``). The agent runs that host's ranks with the ordinary launcher
(fork, supervision, teardown, hang diagnosis) and sends every event back on its stdout, which is the SSH
channel, each frame signed (``agent_channel.sign_frame``).

stdin carries: one JSON line (this node's settings and, over SSH, the run's secret), the pickled function and
arguments (``payload_bytes`` of them), then control lines: ``{"master_addr": a, "master_port": p}`` for nodes
other than 0 (node 0 reserves the port for the ranks' store, on the address the kernel reached it on, and reports both
first), and ``{"stop": true}``. End of stdin means stop as well, so a dropped connection or a killed kernel ends
this host's ranks: nothing is left behind. Each host signs with its own key, derived from the secret.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import sys
import threading
import traceback

from ..cluster.agent_channel import AGENT_ENV_VAR, AGENT_MAGIC, node_key, sign_frame
from ..schema.events import AGENT_EVENT, NODE_ERROR_EVENT, NOTE_EVENT, encode_frame, write_all


class SignedWriter:
    """The agent's end of the channel: one signed frame per event, from any thread."""

    def __init__(self, fd: int, secret: bytes):
        self._fd = fd
        self._secret = secret
        self._counter = 0
        self._lock = threading.Lock()
        write_all(fd, AGENT_MAGIC)

    def send(self, rank: int, kind: str, data: dict, attachment: bytes = b"") -> None:
        with self._lock:
            self._counter += 1
            frame = encode_frame(rank, self._counter, kind, data, attachment)
            write_all(self._fd, sign_frame(self._secret, self._counter, frame))


class ForwardingDisplay:
    """The launcher's display on an agent: every event and note goes to the kernel instead of a screen."""

    def __init__(self, writer: SignedWriter):
        self._writer = writer

    def show(self, event) -> None:
        self._writer.send(event.rank, event.kind, event.data, bytes(event.attachment))

    def note(self, text: str) -> None:
        self._writer.send(-1, NOTE_EVENT, {"text": text})

    def tick(self) -> None:
        pass

    def retarget(self, node_rank: int, ranks) -> None:
        pass


class StdinReader:
    """Reads the agent's input (fd 0, or its connection to the kernel) with os.read and a buffer of its own.
    Not sys.stdin: a thread blocked in sys.stdin holds its lock, and the ranks forked meanwhile would inherit it
    held (and hang the first time they touch stdin)."""

    def __init__(self, fd: int = 0):
        self._fd = fd
        self._buffer = bytearray()
        self._eof = False

    def _fill(self) -> None:
        try:
            chunk = os.read(self._fd, 65536)
        except OSError:  # the connection was reset: the same as its end
            chunk = b""
        self._eof = not chunk
        self._buffer += chunk

    def read(self, size: int) -> bytes:
        while len(self._buffer) < size and not self._eof:
            self._fill()
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def readline(self) -> bytes:
        while b"\n" not in self._buffer and not self._eof:
            self._fill()
        end = self._buffer.find(b"\n") + 1 or len(self._buffer)
        line = bytes(self._buffer[:end])
        del self._buffer[:end]
        return line


def _watch_stdin(stdin: StdinReader) -> None:
    """A stop request, or the end of stdin (the kernel or the connection went away), or a message that is not
    the kernel's: interrupt the launch, which stops every rank of this host the way a kernel interrupt does."""
    from ..cluster.backchannel import ChannelRefused

    try:
        while True:
            line = stdin.readline()
            if not line or json.loads(line).get("stop"):
                break
    except ChannelRefused as exc:
        print(f"notebook_launcher.launchers.agent: {exc}; stopping", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGINT)


def _connect_back() -> tuple[int, StdinReader, bytes]:
    """Started by mpirun: connect to the kernel named in $NOTEBOOK_LAUNCHER_AGENT, and both prove they hold node
    N's key of this run (node N = this MPI rank; ``backchannel``); the connection then carries what stdin and
    stdout do over SSH, each message from the kernel checked before it is read."""
    from ..cluster.backchannel import connect

    address, port, secret = os.environ.pop(AGENT_ENV_VAR).split()  # the ranks do not inherit the secret
    node_rank = int(next(os.environ[name] for name in _MPI_RANK_VARS if name in os.environ))
    channel, session = connect(address, int(port), bytes.fromhex(secret), node_rank)
    return channel, CheckedReader(channel, session), bytes.fromhex(secret)


class CheckedReader(StdinReader):
    """The agent's input over its connection to the kernel: whole messages, each checked with the session
    before a byte of it is returned (so nothing unchecked is parsed, let alone unpickled)."""

    def __init__(self, fd: int, session):
        super().__init__(fd)
        self._session = session

    def _fill(self) -> None:
        chunk = self._session.receive(self._fd)  # ChannelRefused if it is not the kernel's
        self._eof = not chunk
        self._buffer += chunk


# (srun: task N of the step, one per node, on the step's N-th node)
_MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


def main(argv: list[str]) -> int:
    secret = None  # with --connect, from mpirun's environment (the connection never carries it)
    if "--connect" in argv:
        channel, stdin, secret = _connect_back()
    else:
        channel = os.dup(1)
        stdin = StdinReader(0)
    os.dup2(2, 1)  # whatever else writes to stdout (a library, a print) goes to stderr, not into the frames
    sys.stdout = sys.stderr
    os.register_at_fork(after_in_child=lambda: _close_quietly(channel))  # ranks must not hold the channel open
    config = json.loads(stdin.readline())
    node_rank = config["node_rank"]
    payload = stdin.read(config["payload_bytes"])
    writer = SignedWriter(channel, node_key(secret or bytes.fromhex(config["secret"]), node_rank))
    reservation = None
    try:
        if node_rank == 0:
            from ..cluster.ports import PortReservation

            reservation = PortReservation("0.0.0.0", config["requested_port"])
            master = {"master_addr": config.get("node_address") or _address_seen_by_the_kernel(),
                      "master_port": reservation.port}
            writer.send(-1, AGENT_EVENT, master)
        else:
            line = stdin.readline()  # where node 0's ranks serve the store; a stop or EOF first: the run ended
            master = json.loads(line) if line else {}
            if "master_port" not in master:
                raise KeyboardInterrupt
        threading.Thread(target=_watch_stdin, args=(stdin,), daemon=True, name="stop-watcher").start()
        function, args = _load(payload)
        code = _launch(function, args, config, master, writer, reservation)
    except KeyboardInterrupt:
        code = 130
    except BaseException as exc:  # noqa: BLE001 - whatever stops this host is told to the kernel
        writer.send(-1, NODE_ERROR_EVENT, {"type": type(exc).__name__, "message": str(exc),
                                           "traceback": traceback.format_exc()})
        code = 1
    finally:
        if reservation is not None:
            reservation.close()
    writer.send(-1, AGENT_EVENT, {"done": code})
    return code


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _address_seen_by_the_kernel() -> str:
    """The address the kernel's SSH connection reached this host on (``$SSH_CONNECTION``): an address, not an
    SSH alias or user@host, and one the network routes to; else this host's name."""
    import socket

    fields = os.environ.get("SSH_CONNECTION", "").split()
    return fields[2] if len(fields) == 4 else socket.getfqdn()


def _load(payload: bytes):
    """The kernel's sys.path first (so functions pickled by reference import), then (function, args)."""
    stream = io.BytesIO(payload)
    for entry in pickle.load(stream):
        if entry not in sys.path:
            sys.path.append(entry)
    return pickle.load(stream)


def _launch(function, args, config: dict, master: dict, writer: SignedWriter, reservation) -> int:
    from ..errors import LaunchTimeoutError, RankFailedError
    from ..plan import plan_on_agent
    from . import launch

    if reservation is not None:
        reservation.close()  # rank 0's store binds it next
    try:
        plan = plan_on_agent(config["plan"], function, args, master["master_addr"], int(master["master_port"]))
        launch(plan, ForwardingDisplay(writer), single_attempt=True)  # the launching kernel decides new tries
    except RankFailedError:
        return 1  # its events (failures, exits) are already on their way
    except LaunchTimeoutError as exc:
        writer.send(-1, NODE_ERROR_EVENT, {"type": "LaunchTimeoutError", "message": str(exc), "traceback": ""})
        return 1
    return 0


if __name__ == "__main__":
    from ..cluster.backchannel import ChannelRefused

    try:
        exit_code = main(sys.argv[1:])
    except ChannelRefused as exc:  # a kernel that is not this run's: nothing it sent was read
        print(f"notebook_launcher.launchers.agent: {exc}", file=sys.stderr)
        exit_code = 1
    sys.stderr.flush()
    os._exit(exit_code)  # every frame is written; skip the interpreter's teardown (~0.5 s with torch loaded)
