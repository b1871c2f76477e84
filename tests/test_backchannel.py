"""The connection each agent started by mpirun opens back to the kernel (``start_hosts_with="mpirun"``).

Its port is reachable by others: strangers must neither stall a launch nor learn anything of it, and an agent
must never unpickle what does not come from its run's kernel. Open MPI reaches 127.0.0.2 through the test's
sshd (``plm_rsh_agent``), as in test_cluster.py.
"""

from __future__ import annotations

import json
import os
import pickle
import secrets
import shlex
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from notebook_launcher import last_run, notebook_launcher
from notebook_launcher.cluster.agent_channel import AGENT_ENV_VAR, node_key
from notebook_launcher.cluster.backchannel import Session

pytestmark = pytest.mark.processes

HOSTS = ["127.0.0.1", "127.0.0.2"]
CHALLENGE = b"NOTEBOOK-LAUNCHER-KERNEL/1 "


def sum_of_ones():
    import torch
    import torch.distributed as dist

    total = torch.ones(1)
    dist.all_reduce(total)
    return dist.get_world_size(), total.item()


def _listening() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_LISTEN}


def _line(connection: socket.socket) -> bytes:
    line = b""
    while not line.endswith(b"\n"):
        byte = connection.recv(1)
        if not byte:
            break
        line += byte
    return line


class Intruders(threading.Thread):
    """As soon as the kernel listens for its agents, 30 connections: idle ones, ones that talk too much, and ones
    that answer the challenge with another run's key. Each records everything the kernel ever sent it."""

    def __init__(self):
        super().__init__(daemon=True)
        self.before = _listening()
        self.address = None
        self.heard: list[bytes] = []

    def run(self) -> None:
        deadline = time.monotonic() + 60
        while not (_listening() - self.before) and time.monotonic() < deadline:
            time.sleep(0.002)
        self.address = next(iter(_listening() - self.before), None)
        if self.address is None:
            return
        connections = []
        for number in range(30):
            connection = socket.create_connection(self.address, timeout=60)
            if number % 3 == 1:
                connection.sendall(b"0 " * 600)  # more than any hello
            elif number % 3 == 2:
                nonce, agent_nonce = bytes.fromhex(_line(connection)[len(CHALLENGE):].decode()), secrets.token_bytes(16)
                proof = Session(node_key(b"another run", 1), nonce, agent_nonce).proof(b"agent")
                connection.sendall(f"1 {agent_nonce.hex()} {proof}\n".encode())
                self.heard.append(CHALLENGE)  # (what it read already)
            connections.append(connection)
        for connection in connections:
            said = b""
            try:
                while chunk := connection.recv(4096):  # until the kernel closes it
                    said += chunk
            except OSError:  # reset: closed with our bytes unread
                pass
            connection.close()
            self.heard.append(said)


def _mpirun_through(local_sshd) -> list[str]:
    agent = shlex.join(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", *local_sshd])
    return ["--mca", "plm_rsh_agent", agent]


def test_strangers_on_the_back_channel_neither_stall_the_launch_nor_learn_anything(local_sshd, monkeypatch):
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    intruders = Intruders()
    intruders.start()
    result = notebook_launcher(sum_of_ones, num_processes=1, hosts=HOSTS, device="cpu", timeout=120,
                               display="text", start_hosts_with="mpirun", mpirun_options=_mpirun_through(local_sshd))
    assert result == (2, 2.0) and last_run().status == "finished"
    intruders.join(timeout=60)
    assert intruders.address is not None and intruders.address[0] == "127.0.0.1"  # the hosts' route, not 0.0.0.0
    said = [text for text in intruders.heard if text != CHALLENGE]
    assert len(said) == 30
    for text in said:  # a challenge at most (an intruder that talked too much may be cut off first), then closed
        assert text == b"" or text.startswith(CHALLENGE) and text.count(b"\n") == 1 and text.endswith(b"\n"), text


class _CreatesAFile:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")  # unpickling this creates the file


@pytest.mark.parametrize("kernel", ["without the key", "with the key, its message altered", "with the key"])
def test_an_agent_unpickles_only_what_its_kernel_sent(tmp_path, kernel):
    marker = tmp_path / "unpickled"
    secret = secrets.token_bytes(32)
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)
        port = server.getsockname()[1]
        env = {**os.environ, AGENT_ENV_VAR: f"127.0.0.1 {port} {secret.hex()}",
               "OMPI_COMM_WORLD_RANK": "0"}
        agent = subprocess.Popen([sys.executable, "-m", "notebook_launcher.launchers.agent", "--connect"], env=env,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            connection, _ = server.accept()
            connection.settimeout(60)
            nonce = secrets.token_bytes(16)
            connection.sendall(CHALLENGE + nonce.hex().encode() + b"\n")
            node_rank, agent_nonce, _ = _line(connection).split()
            key = node_key(secret if kernel != "without the key" else secrets.token_bytes(32), 0)
            session = Session(key, nonce, bytes.fromhex(agent_nonce.decode()))
            payload = pickle.dumps(_CreatesAFile(str(marker)))
            config = {"node_rank": 0, "payload_bytes": len(payload), "requested_port": 0}
            message = session.seal(json.dumps(config).encode() + b"\n" + payload)
            if kernel == "with the key, its message altered":
                message = message[:-1] + bytes([message[-1] ^ 1])
            connection.sendall(session.proof(b"kernel").encode() + b"\n" + message)
            code, stderr = agent.wait(timeout=60), agent.stderr.read().decode()
            connection.close()
        finally:
            agent.kill()
            agent.wait()
            agent.stderr.close()
    if kernel == "with the key":  # the control: this is what the key and the checks stand between
        assert marker.exists()
        return
    assert code == 1 and not marker.exists()
    if kernel == "without the key":
        assert f"the kernel at 127.0.0.1:{port} did not prove it holds this run's key" in stderr, stderr
    else:
        assert "a message on the connection to the kernel is not signed with this run's key" in stderr, stderr
