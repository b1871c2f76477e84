"""Host names and hostfiles are checked before anything runs: a "host" must never become an ssh or mpirun option.

The reproducer of the hole: ``hosts=["-oProxyCommand=touch FILE"]`` ran ``touch`` on this machine through ssh.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from notebook_launcher import LaunchArgumentError, doctor, notebook_launcher
from notebook_launcher.cluster.remote import read_hostfile, resolve_hosts, ssh_command
from notebook_launcher.doctor import PROBLEM, check_ssh


def work():
    return 1


@pytest.mark.processes
def test_a_host_that_is_an_ssh_option_is_refused_and_runs_nothing(tmp_path):
    pwned = tmp_path / "pwned"
    option = f"-oProxyCommand=touch {pwned}"
    for start_with in ("ssh", "mpirun"):
        with pytest.raises(LaunchArgumentError, match=r"hosts\[1\]='-oProxyCommand=touch .*' is not a host: it "
                                                      r"starts with '-'.* Give a DNS name"):
            notebook_launcher(work, hosts=["127.0.0.1", option], start_hosts_with=start_with, device="cpu")
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"# the cluster\n127.0.0.1 slots=1\n{option}\n")
    with pytest.raises(LaunchArgumentError) as caught:
        notebook_launcher(work, hostfile=str(hostfile), device="cpu")
    assert str(caught.value).startswith(f"hostfile='{hostfile}', line 3: '-oProxyCommand=touch' is not a host: "
                                        f"it starts with '-'")
    report = doctor(hostfile=str(hostfile))  # the doctor refuses it the same way, and runs neither ssh nor mpirun
    assert report["hostfile"].verdict == PROBLEM and "line 3" in report["hostfile"].found
    assert not any(check.name.startswith(("ssh", "mpirun")) for check in report.checks)
    check = check_ssh(option)
    assert check.verdict == PROBLEM and "starts with '-'" in check.found
    assert not pwned.exists()


@pytest.mark.processes
def test_ssh_reads_the_host_as_a_host_even_if_it_looks_like_an_option(tmp_path):
    pwned = tmp_path / "pwned"
    command = ssh_command(f"-oProxyCommand=touch {pwned}", ["-o", "ConnectTimeout=1"], ["true"])
    assert command[command.index("--") + 1].startswith("-oProxyCommand")  # `--`: the end of ssh's options
    completed = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert completed.returncode != 0 and not pwned.exists()


@pytest.mark.parametrize("host, why", [
    ("node a", "only letters, digits"), ("node;reboot", "only letters, digits"), ("$(touch x)", "only letters"),
    ("a`id`", "only letters"), ("node-a:22", "a port goes in ssh_options"), ("bad user@node-a", "not a user name"),
    ("-v", "starts with '-'"), ("a..b", "only letters"), ("[node-a]", "only an IPv6 address goes in [brackets]"),
    ("node\x00a", "only letters"), ("node-a,node-b", "only letters"), ("@node-a", "not a user name"),
])
def test_what_is_not_a_host_is_refused_naming_the_entry(host, why):
    with pytest.raises(LaunchArgumentError, match=r"hosts\[0\]=.* is not a host: .*" + re.escape(why)):
        resolve_hosts([host], None, 1, 0, None)


def test_the_host_forms_users_write_are_accepted(tmp_path):
    hosts = ["alice@127.0.0.1", "node-a", "node-b.example.com", "10.0.0.2", "::1", "[fe80::1]", "bob@[::2]",
             "fe80::3%eth0", "gpu_box", " node-c "]
    assert resolve_hosts(hosts, None, 1, 0, None) == [
        "alice@127.0.0.1", "node-a", "node-b.example.com", "10.0.0.2", "::1", "fe80::1", "bob@::2", "fe80::3%eth0",
        "gpu_box", "node-c"]  # brackets dropped: ssh takes an IPv6 address bare
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node-a slots=4\nnode-b:2\n[::1]:4\nfe80::2\nalice@node-c\tslots=2  # the last\r\n")
    assert read_hostfile(str(hostfile)) == ["node-a", "node-b", "::1", "fe80::2", "alice@node-c"]


@pytest.mark.processes
def test_a_binary_hostfile_is_a_launch_argument_error(tmp_path):
    hostfile = tmp_path / "hosts.bin"
    hostfile.write_bytes(b"node-a\n\x7fELF\x02\x01\x01\x00\xff\xfe\x00\n")
    with pytest.raises(LaunchArgumentError) as caught:
        notebook_launcher(work, hostfile=str(hostfile), device="cpu")
    assert str(caught.value) == (f"hostfile='{hostfile}', line 2: not UTF-8 text (byte 0xff at column 9); a "
                                 f"hostfile is a text file with one host per line: is this the right file?")
