"""A real key-only sshd on 127.0.0.1 and 127.0.0.2 (two "hosts" on this machine) and a free port: the
``local_sshd`` fixture's, and benchmarks/hosts_launch.py's."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time

from helpers.processes import free_port

START_S = 10  # sshd listens within milliseconds; this machine is shared


class LocalSshd:
    """sshd in the foreground, in a session of its own, with its keys, config and log in ``folder``. ``options``
    are the ssh options that reach it; ``stop()`` ends it by its pid."""

    def __init__(self, folder):
        self.dir = str(folder)
        os.makedirs(self.dir, exist_ok=True)
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        if not os.path.exists(sshd):
            raise RuntimeError("sshd is missing: `make system-deps` (apt-get install openssh-server) installs it")
        os.makedirs("/run/sshd", exist_ok=True)
        host_key, self.user_key = os.path.join(self.dir, "host_key"), os.path.join(self.dir, "user_key")
        for key in (host_key, self.user_key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        authorized = os.path.join(self.dir, "authorized_keys")
        shutil.copy(f"{self.user_key}.pub", authorized)
        self.port = free_port()
        self.config = os.path.join(self.dir, "sshd_config")
        with open(self.config, "w") as config:
            config.write(f"Port {self.port}\nListenAddress 127.0.0.1\nListenAddress 127.0.0.2\nHostKey {host_key}\n"
                         f"AuthorizedKeysFile {authorized}\nPasswordAuthentication no\n"
                         "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\n"
                         "UsePAM no\nPidFile none\n")
        self.log = open(os.path.join(self.dir, "sshd.log"), "wb")  # noqa: SIM115 - open while sshd runs
        self.server = subprocess.Popen([sshd, "-D", "-e", "-f", self.config], stdout=subprocess.DEVNULL,
                                       stderr=self.log, start_new_session=True)
        deadline = time.monotonic() + START_S
        while True:
            with socket.socket() as first, socket.socket() as second:
                if first.connect_ex(("127.0.0.1", self.port)) == 0 and second.connect_ex(("127.0.0.2", self.port)) == 0:
                    break
            if time.monotonic() > deadline or self.server.poll() is not None:
                self.stop()
                raise RuntimeError(f"sshd did not start on port {self.port}: see {self.log.name}")
            time.sleep(0.05)
        self.options = ["-p", str(self.port), "-i", self.user_key, "-o",
                        f"UserKnownHostsFile={os.path.join(self.dir, 'known_hosts')}"]

    def stop(self) -> int:
        """SIGTERM to sshd's session (SIGKILL after 10 s); its exit code."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server.pid, signal.SIGTERM)
        try:
            self.server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        self.log.close()
        return self.server.returncode
