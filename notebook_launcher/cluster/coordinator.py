"""Kernel side of a launch across hosts: an agent per host, ``notebook_launcher.launchers.agent``, started the
way ``start`` says (``starts.py``: over one SSH connection per host, or by mpirun or srun, connecting back).

Each host is one node (node rank = its position in ``hosts``). The kernel sends each agent its settings, a per-run
secret and the function (cloudpickle), then reads the agents' signed event frames from their channels (ssh's pipes,
or their connections back) into the same event pipeline as local ranks. A frame that is not signed with the run's
secret ends the run; nothing from a host is decoded (let alone unpickled) before its signature is checked. The first
failure on any host stops every host: the agents are told to stop (and their input closed, which stops them too),
and the processes that started them still there after ``STOP_GRACE_S`` are killed, which closes their channels and
stops the remote side.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from typing import TYPE_CHECKING

from ..errors import HostFailedError
from ..schema.events import AGENT_EVENT, EXIT, FAILURE, NODE_ERROR_EVENT, NOTE_EVENT, STATUS, Event
from ..schema.status import StopReason
from .agent_channel import AGENT_ENV_VAR, SignedFrameReader, UnverifiedStream, node_key
from .backchannel import BackChannel, listen_address
from .starts import AgentEnd, AgentStart

if TYPE_CHECKING:  # (only a type: this layer does not import the plan's module)
    from ..plan import LaunchPlan

STOP_GRACE_S = 10.0  # agents stop their ranks themselves (SIGTERM, then SIGKILL after 1 s) well within this
PEER_REPORT_GRACE_S = 1.0  # after a failure, how long the other hosts may take to report theirs
EOF_GRACE_S = 2.0  # after a host's ssh exited (or its agent said it was done), how long its pipes may stay open


class _SocketControl:
    """The kernel's writing end of an agent's connection: closing it ends the agent's input (a stop) while its
    events can still arrive on the same connection."""

    def __init__(self, connection: socket.socket):
        self._connection = connection
        self._writer = connection.dup()
        self.closed = False

    def fileno(self) -> int:
        return self._writer.fileno()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self._connection.shutdown(socket.SHUT_WR)
            self._writer.close()


class RemoteNode:
    def __init__(self, host: str, node_rank: int, secret: bytes):
        self.host = host
        self.node_rank = node_rank
        self.reader = SignedFrameReader(node_key(secret, node_rank))
        self.process: subprocess.Popen | None = None  # its ssh; with mpirun, the one mpirun of every host
        self.command: list[str] = []  # that process's command line
        self.control = None  # where the kernel writes to its agent: ssh's stdin, or the agent's connection
        self.sources: list = []  # what the kernel reads from it: ssh's stdout and stderr, or the connection
        self.connected = False  # mpirun: its agent connected back and proved it holds the key
        self.connection: socket.socket | None = None
        self.session = None  # mpirun: what seals the kernel's messages on the connection (backchannel.Session)
        self.outbox = bytearray()  # what is still to be written to its stdin (never a blocking write)
        self.close_stdin = False  # close stdin once the outbox is written (a stop)
        self.ended_at: float | None = None  # when its ssh exited or its agent said it was done
        self.killed = False  # killed by us, after a stop
        self.stderr_tail: deque = deque(maxlen=20)
        self.stderr_partial = b""
        self.done_code: int | None = None
        self.error: dict | None = None  # a node_error the agent sent
        self.broken: str | None = None  # why its stream was refused
        self.dropped = False  # its channel ended before its agent said it was done
        self.open_pipes = 0
        self.seq: dict[int, int] = {}


class Cluster:
    """``run()`` starts every host's agent, carries their events to ``on_event`` and returns when all are gone."""

    def __init__(self, plan: LaunchPlan, hosts: list[str], start: AgentStart, payload: bytes, on_event, note,
                 on_tick=None, python: str | None = None):
        self.plan = plan
        self.secret = secrets.token_bytes(32)
        self.nodes = [RemoteNode(host, rank, self.secret) for rank, host in enumerate(hosts)]
        self.start = start  # how the agents start (starts.py)
        self._master_line = b""  # node 0's store address, for the other agents
        self._backchannel: BackChannel | None = None
        self._start_output = RemoteNode(start.name, -1, self.secret)  # connecting back: the one starter's own lines
        self.payload = payload
        self.on_event = on_event
        self.note = note
        self.on_tick = on_tick or (lambda: None)
        self.python = python or sys.executable
        self.stop_reason: StopReason | None = None
        self._stop_at: float | None = None
        self._kill_at: float | None = None
        self._selector = selectors.DefaultSelector()
        self._reported: set[int] = set()

    # -- start -------------------------------------------------------------------------------------------------
    def _config(self, node: RemoteNode) -> dict:
        plan = self.plan
        extra = {"secret": self.secret.hex()} if self.start.over_pipes else {}  # (else: from its environment)
        if self.start.node_addresses is not None:  # node 0's ranks serve the store on the address it is known by
            extra["node_address"] = self.start.node_addresses[node.node_rank]
        return {**extra, "payload_bytes": len(self.payload), "node_rank": node.node_rank,
                "requested_port": plan.requested_port, "plan": plan.for_agent(node.node_rank)}

    def _start(self, node: RemoteNode) -> None:
        """Over pipes: this host's own process (its ssh), whose stdin/stdout are its agent's channel."""
        node.command = self.start.command([node.host], [self.python, "-m", "notebook_launcher.launchers.agent"])
        node.process = subprocess.Popen(node.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=self.start.env(), start_new_session=True)
        for pipe, channel in ((node.process.stdout, "events"), (node.process.stderr, "stderr")):
            os.set_blocking(pipe.fileno(), False)
            self._selector.register(pipe, selectors.EVENT_READ, (node, channel))
            node.sources.append(pipe)
            node.open_pipes += 1
        node.control = node.process.stdin
        os.set_blocking(node.control.fileno(), False)
        self._send(node, json.dumps(self._config(node)).encode() + b"\n" + self.payload)

    def _start_connecting(self) -> None:
        """Connecting back: one process starts every host's agent (mpirun, srun); each connects back to the
        back-channel (backchannel.py) on the address the hosts reach this kernel on."""
        hosts = [node.host for node in self.nodes]
        try:
            self._backchannel = channel = BackChannel(listen_address(self.start.node_addresses or hosts), self.secret,
                                                      len(self.nodes), self._selector)
        except OSError as exc:
            raise HostFailedError(f"start_hosts_with={self.start.name!r}: cannot listen for the agents on the address "
                                  f"the hosts reach this machine on ({exc}); check this machine's name and network, or "
                                  f"use start_hosts_with='ssh'") from None
        command = self.start.command(hosts, [self.python, "-m", "notebook_launcher.launchers.agent", "--connect"])
        env = {**(self.start.env() or os.environ),
               AGENT_ENV_VAR: f"{channel.address} {channel.port} {self.secret.hex()}"}
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=env, start_new_session=True)
        output = self._start_output
        output.process, output.command = process, command
        for node in self.nodes:
            node.process, node.command = process, command
        for pipe in (process.stdout, process.stderr):
            os.set_blocking(pipe.fileno(), False)
            self._selector.register(pipe, selectors.EVENT_READ, (output, "stderr"))
            output.sources.append(pipe)
            output.open_pipes += 1

    def _hello(self, connection: socket.socket) -> None:
        """A connection to the back-channel said something: once an agent has proven which node it is, the
        kernel proves itself in turn, then sends that node its settings and the function, sealed."""
        proven = self._backchannel.hello(connection)
        if proven is None:
            return
        node_rank, connection, session = proven
        node = self.nodes[node_rank]
        node.connected = True
        node.connection = connection
        self._selector.register(connection, selectors.EVENT_READ, (node, "events"))
        node.sources.append(connection)
        node.open_pipes += 1
        node.control = _SocketControl(connection)
        self._send(node, session.proof(b"kernel").encode() + b"\n")
        node.session = session  # from here on, each message is sealed
        self._send(node, json.dumps(self._config(node)).encode() + b"\n" + self.payload)
        if node.node_rank != 0 and self._master_line:
            self._send(node, self._master_line)

    def _send(self, node: RemoteNode, data: bytes) -> None:
        """Queue bytes for a host's agent; the loop writes them when its pipe or connection takes them (a host
        that does not read never blocks the kernel)."""
        if node.control is None or node.control.closed:
            return
        if node.session is not None:
            data = node.session.seal(data)
        if not node.outbox:
            self._selector.register(node.control, selectors.EVENT_WRITE, (node, "control"))
        node.outbox += data

    def _write(self, node: RemoteNode) -> None:
        control = node.control
        try:
            written = os.write(control.fileno(), node.outbox[:65536])
            del node.outbox[:written]
        except BlockingIOError:
            return
        except OSError:  # the host went away: it is noticed on its other pipes
            node.outbox.clear()
        if not node.outbox:
            self._selector.unregister(control)
            if node.close_stdin:
                control.close()

    # -- the loop ----------------------------------------------------------------------------------------------
    def run(self, timeout: float | None) -> None:
        from ..supervision.interrupts import DeferredInterrupt

        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        self._selector.register(wake_read, selectors.EVENT_READ, (None, "wake"))
        deadline = None if timeout is None else time.monotonic() + timeout + STOP_GRACE_S
        try:
            with DeferredInterrupt(wake_write) as interrupt:
                if self.start.over_pipes:
                    for node in self.nodes:
                        self._start(node)
                else:
                    self._start_connecting()
                while any(node.open_pipes or node.process.poll() is None for node in self._watched()):
                    if interrupt.count and self.stop_reason is None:
                        self.stop(StopReason.INTERRUPTED)
                    now = time.monotonic()
                    self._finish_ended_hosts(now)
                    if deadline is not None and now > deadline and self.stop_reason is None:
                        self.stop(StopReason.TIMEOUT)
                    if self._stop_at is not None and now >= self._stop_at and self.stop_reason is None:
                        self.stop(StopReason.FAILURE)
                    if self._kill_at is not None and now >= self._kill_at:
                        self._kill_all()
                    if self._backchannel is not None:
                        self._backchannel.expire()
                    self._step(0.1)
                    self.on_tick()
        finally:
            self._kill_all()
            for node in self.nodes:
                if node.process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        node.process.wait(timeout=5)
                    for pipe in (node.process.stdin, node.process.stdout, node.process.stderr, node.control,
                                 node.connection):
                        with contextlib.suppress(OSError, ValueError, AttributeError):
                            pipe.close()
            if self._backchannel is not None:
                self._backchannel.close()
            self._selector.close()
            os.close(wake_read)
            os.close(wake_write)

    def _watched(self) -> list[RemoteNode]:
        return self.nodes + ([self._start_output] if self._start_output.process is not None else [])

    def _finish_ended_hosts(self, now: float) -> None:
        """A host whose ssh exited, or whose agent said it was done, gets EOF_GRACE_S for its pipes to close;
        then its ssh (still held open by something on the host) is killed and its pipes are closed here. With
        one process for every agent (mpirun, srun), it is killed only once every agent is done (or it has exited)."""
        for node in self._watched():
            if node.ended_at is None and (node.process.poll() is not None or node.done_code is not None):
                node.ended_at = now
        if self._start_output.process is not None and self._start_output.ended_at is None and all(
                node.ended_at is not None for node in self.nodes):
            self._start_output.ended_at = now
        for node in self._watched():
            if node.ended_at is None or now - node.ended_at <= EOF_GRACE_S:
                continue
            if node.process.poll() is None and (self.start.over_pipes or node is self._start_output):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGKILL)
            for source in node.sources:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(source)
            node.sources.clear()
            node.open_pipes = 0

    def _step(self, wait_s: float) -> None:
        for key, _ in self._selector.select(wait_s):
            node, channel = key.data
            if channel == "wake":
                with contextlib.suppress(BlockingIOError):
                    os.read(key.fd, 512)
                continue
            if channel == "control":
                self._write(node)
                continue
            if channel == "accept":
                self._backchannel.accept()
                continue
            if channel == "hello":
                self._hello(key.fileobj)
                continue
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self._selector.unregister(key.fileobj)
                node.open_pipes -= 1
                if channel == "events":
                    self._host_gone(node)
                continue
            if channel == "stderr":
                self._stderr(node, chunk)
            else:
                self._frames(node, chunk)

    def _stderr(self, node: RemoteNode, chunk: bytes) -> None:
        *lines, node.stderr_partial = (node.stderr_partial + chunk).split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                node.stderr_tail.append(text)
                self.note(text if text.startswith(f"{node.host}: ") else f"{node.host}: {text}")

    def _frames(self, node: RemoteNode, chunk: bytes) -> None:
        if node.broken:
            return
        try:
            frames = node.reader.feed(chunk)
        except UnverifiedStream as exc:
            node.broken = str(exc)
            self.note(f"{node.host}: refused its event stream ({exc}); stopping every host")
            self.stop(StopReason.FAILURE)
            return
        for header, attachment in frames:
            self._handle(node, header, attachment)

    def _handle(self, node: RemoteNode, header: dict, attachment: bytes) -> None:
        kind, data, rank = header.get("kind"), dict(header.get("data") or {}), int(header.get("rank", -1))
        if kind == AGENT_EVENT:
            if "master_port" in data and node.node_rank == 0:
                self._master_line = json.dumps({"master_addr": str(data["master_addr"]),
                                                "master_port": int(data["master_port"])}).encode() + b"\n"
                for other in self.nodes[1:]:
                    self._send(other, self._master_line)  # (an agent that connects later gets it then)
            if "done" in data:
                node.done_code = int(data["done"])
            return
        if kind == NOTE_EVENT:
            self.note(f"{node.host}: {data.get('text', '')}")
            return
        if kind == NODE_ERROR_EVENT:
            node.error = data
            self.stop_soon()
            return
        first = node.node_rank * self.plan.num_processes
        if not first <= rank < first + self.plan.num_processes:
            node.broken = f"an event for rank {rank}, which is not one of this host's ranks"
            self.note(f"{node.host}: refused its event stream ({node.broken}); stopping every host")
            self.stop(StopReason.FAILURE)
            return
        if kind == STATUS and data.get("state") == "starting":
            data["host"] = node.host  # remote ranks show beside local ones with their host
        node.seq[rank] = node.seq.get(rank, 0) + 1
        event = Event(rank=rank, seq=node.seq[rank], time=time.monotonic(), kind=kind, data=data,
                      attachment=attachment)
        self.on_event(event)
        if kind == FAILURE or (kind == EXIT and data.get("exit_code") != 0 and rank not in self._reported
                               and not data.get("stopped_by_launcher")):
            self._reported.add(rank)
            self.stop_soon()

    def _host_gone(self, node: RemoteNode) -> None:
        """A host's channel closed. Normal after it said it was done; otherwise the host dropped out."""
        if node.done_code is None and self.stop_reason is None:
            node.dropped = True
            self.note(f"{node.host}: the connection ended before its ranks finished")
            self.stop(StopReason.FAILURE)

    # -- stopping ----------------------------------------------------------------------------------------------
    def stop_soon(self) -> None:
        """A failure: the other hosts get a moment to report theirs (the root cause may be elsewhere)."""
        if self._stop_at is None:
            self._stop_at = time.monotonic() + PEER_REPORT_GRACE_S

    def stop(self, reason: StopReason) -> None:
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        for node in self.nodes:
            if node.control is None or node.control.closed:
                continue
            if node.done_code is None:
                self._send(node, b'{"stop": true}\n')
            node.close_stdin = True  # the end of its input stops the agent too, once the stop line is written
            if not node.outbox:
                node.control.close()
        self._kill_at = time.monotonic() + STOP_GRACE_S

    def _kill_all(self) -> None:
        for node in self._watched():
            if node.process is not None and node.process.poll() is None:
                node.killed = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGKILL)

    # -- after -------------------------------------------------------------------------------------------------
    def host_problem(self) -> str | None:
        """Why a host could not take part, if one could not (SSH, a crashed agent, a refused stream)."""
        for node in self.nodes:
            code = node.process.returncode if node.process is not None else None
            if node.broken:
                return f"host {node.host}: its event stream was refused: {node.broken}."
            if node.done_code is None and code not in (None, 0) and self.stop_reason in (None, StopReason.FAILURE) \
                    and not node.killed:  # its ssh ended by itself, not because we stopped the run
                tail = node.stderr_tail if self.start.over_pipes else self._start_output.stderr_tail
                return self.start.problem(AgentEnd(node.host, node.node_rank, code, node.command, list(tail),
                                                   node.connected, self.python))
        for node in self.nodes:
            if node.dropped:  # its channel ended early, though its ssh had not failed (yet): we stopped it
                return (f"host {node.host} (node {node.node_rank}): the connection ended before its ranks finished "
                        f"(its agent or the network went away); every host was stopped")
        return None

    def node_error(self) -> tuple[RemoteNode, dict] | None:
        for node in self.nodes:
            if node.error:
                return node, node.error
        return None
