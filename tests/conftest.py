"""Shared fixtures: small and general on purpose."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# tests/xla needs the real torch_xla, in the venv of its own that `make test-xla` builds and runs it in
collect_ignore = [] if os.environ.get("NOTEBOOK_LAUNCHER_TEST_XLA") == "1" else ["xla"]


@pytest.fixture(autouse=True)
def runs_dir(tmp_path, monkeypatch):
    """Run logs of every test go to a temp dir (NOTEBOOK_LAUNCHER_RUNS_DIR), never to the user's cache.

    Set in os.environ, so kernels and subprocesses started by the test inherit it too.
    """
    path = tmp_path / "runs"
    monkeypatch.setenv("NOTEBOOK_LAUNCHER_RUNS_DIR", str(path))
    return path


@pytest.fixture
def repo_root() -> str:
    return REPO_ROOT


def run_torchrun(script, *script_args, nproc: int = 2, timeout: float = 120):
    """``torchrun --standalone`` on a script, in a session of its own that is killed whole if it overruns."""
    import signal
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), str(script),
         *map(str, script_args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # torchrun's workers too, whatever happened
        except ProcessLookupError:
            pass
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture
def local_sshd(tmp_path):
    """A real sshd on 127.0.0.1 and 127.0.0.2 (two "hosts") and a free port, key-based, stopped after the test.
    Yields the ssh options that reach it."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        pytest.fail("sshd is missing: .ci/run installs openssh-server")
    os.makedirs("/run/sshd", exist_ok=True)
    host_key, user_key = tmp_path / "host_key", tmp_path / "user_key"
    for key in (host_key, user_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    authorized = tmp_path / "authorized_keys"
    shutil.copy(f"{user_key}.pub", authorized)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "sshd_config"
    config.write_text(f"Port {port}\nListenAddress 127.0.0.1\nListenAddress 127.0.0.2\nHostKey {host_key}\nAuthorizedKeysFile {authorized}\n"
                      "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin "
                      "prohibit-password\nStrictModes no\nUsePAM no\nPidFile none\n")
    server = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as first, socket.socket() as second:
            if first.connect_ex(("127.0.0.1", port)) == 0 and second.connect_ex(("127.0.0.2", port)) == 0:
                break
        time.sleep(0.05)
    options = ["-p", str(port), "-i", str(user_key), "-o", f"UserKnownHostsFile={tmp_path / 'known_hosts'}"]
    try:
        yield options
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def slurm_cluster():
    """A real two-node Slurm on loopback (``tests/slurm_cluster.py``: munged, slurmctld, slurmd n1 and n2, on
    ports of their own), started once for each test module that uses it and stopped by pid at the module's end,
    with a check that none of its daemons is left. (Module scope, not session: its daemons are children of this
    process, and the other modules' tests check that a launch leaves this process no child.) ``SLURM_CONF``
    points at it in os.environ meanwhile. Skips only where the Slurm or munge binaries are absent (``make
    system-deps`` installs them)."""
    from slurm_cluster import SlurmCluster, slurm_missing

    missing = slurm_missing()
    if missing:
        pytest.skip(missing)
    cluster = SlurmCluster().start()
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.conf
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        cluster.stop()
