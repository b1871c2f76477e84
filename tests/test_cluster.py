"""One notebook drives two hosts: 127.0.0.1 and 127.0.0.2, reached through a real sshd the test starts.

Each host runs ``notebook_launcher.launchers.agent`` over SSH; the ranks of both make one process group, and everything
they say comes back to the launching process, signed with the run's secret.
"""

from __future__ import annotations

import os
import re
import time

import psutil
import pytest

from notebook_launcher import HostFailedError, LaunchArgumentError, RankFailedError, last_run, notebook_launcher
from notebook_launcher.cluster.agent_channel import (
    AGENT_MAGIC,
    SignedFrameReader,
    UnverifiedStream,
    node_key,
    sign_frame,
)
from notebook_launcher.schema.events import STATUS, encode_frame

HOSTS = ["127.0.0.1", "127.0.0.2"]


def everyone(pid_dir):
    import socket

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as out:
        out.write(str(os.getpid()))
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    print(f"rank {rank} of {dist.get_world_size()} on {socket.gethostname()}: sum {total.item()}")
    return rank, dist.get_world_size(), total.item()


def one_rank_is_killed(pid_dir):
    import signal

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as out:
        out.write(str(os.getpid()))
    dist.all_reduce(torch.ones(1))
    print(f"rank {rank} is up", flush=True)
    if rank == 3:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))  # the others wait here for rank 3, which never comes
    time.sleep(60)


def _pids(pid_dir) -> list[int]:
    return [int(path.read_text()) for path in sorted(pid_dir.iterdir())]


def _agents() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if "notebook_launcher.launchers.agent" in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


def _all_gone(pids, timeout=10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids) \
                and not _agents():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.processes
def test_two_hosts_over_ssh_make_one_group_and_every_line_comes_back(local_sshd, tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    result = notebook_launcher(everyone, args=(str(pid_dir),), num_processes=2, hosts=HOSTS, ssh_options=local_sshd,
                               device="cpu", timeout=120, display="text")
    assert result == (0, 4, 6.0)
    run = last_run()
    assert run.status == "finished" and sorted(run.exit_codes) == [0, 1, 2, 3]
    for rank in range(4):
        assert any(re.fullmatch(rf"rank {rank} of 4 on .*: sum 6.0", line) for line in run.output(rank)), run.output()
    hosts = {event.rank: event.data.get("host") for event in run.events
             if event.kind == STATUS and event.data.get("state") == "starting"}
    assert hosts == {0: "127.0.0.1", 1: "127.0.0.1", 2: "127.0.0.2", 3: "127.0.0.2"}
    assert _all_gone(_pids(pid_dir)), "ranks or agents left behind"


@pytest.mark.processes
def test_the_panel_shows_remote_ranks_with_their_host(local_sshd, tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    notebook_launcher(everyone, args=(str(pid_dir),), num_processes=1, hosts=HOSTS, ssh_options=local_sshd,
                      device="cpu", timeout=120, display="panel")
    state = last_run().panel_state
    assert [(rank["rank"], rank["host"], rank["status"]) for rank in state["ranks"]] == [
        (0, "127.0.0.1", "finished"), (1, "127.0.0.2", "finished")]
    assert state["ranks"][1]["lines"][-1]["text"].startswith("rank 1 of 2 on ")


def sum_of_ones():
    import psutil
    import torch
    import torch.distributed as dist

    total = torch.ones(1)
    dist.all_reduce(total)
    parent = " ".join(psutil.Process(os.getppid()).cmdline())
    return dist.get_rank(), dist.get_world_size(), total.item(), "notebook_launcher.launchers.agent" in parent


@pytest.mark.processes
def test_one_process_per_host_runs_in_a_worker_whose_result_comes_back(local_sshd):
    for hosts, world_size in ((HOSTS, 2), (HOSTS[:1], 1)):
        result = notebook_launcher(sum_of_ones, num_processes=1, hosts=hosts, ssh_options=local_sshd, device="cpu",
                                   timeout=120, display="text")
        assert result == (0, world_size, float(world_size), True)  # a worker forked by the host's agent
        run = last_run()
        assert run.status == "finished" and run.results[0] == result and sorted(run.exit_codes) == list(
            range(world_size))


@pytest.mark.processes
def test_a_rank_killed_on_one_host_ends_the_run_on_every_host(local_sshd, tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(one_rank_is_killed, args=(str(pid_dir),), num_processes=2, hosts=HOSTS,
                          ssh_options=local_sshd, device="cpu", timeout=120, display="text")
    assert time.monotonic() - started < 60  # not the 120 s timeout
    assert caught.value.rank == 3 and "SIGKILL" in caught.value.failure.type
    assert str(caught.value).startswith("Rank 3 failed first: killed by SIGKILL")
    assert "Rank 3 ran on 127.0.0.2 (127.0.0.1: ranks 0-1; 127.0.0.2: ranks 2-3)." in str(caught.value)
    assert _all_gone(_pids(pid_dir)), "ranks or agents left behind on a host"


@pytest.mark.processes
def test_an_unreachable_host_is_named_with_what_ssh_said_and_the_fix(local_sshd):
    options = [option if option != local_sshd[1] else "1" for option in local_sshd]  # port 1: nobody there
    with pytest.raises(HostFailedError) as caught:
        notebook_launcher(everyone, args=("/nonexistent",), num_processes=1, hosts=HOSTS, ssh_options=options,
                          device="cpu", timeout=60, display="text")
    message = str(caught.value)
    assert message.startswith("host 127.0.0.1 (node 0) could not run its ranks: `ssh ")
    assert "Connection refused" in message and "ssh-copy-id" in message
    assert "The doctor's SSH check: problem, " in message
    assert not _agents()


def test_frames_not_signed_with_the_run_secret_are_refused_before_anything_is_decoded():
    secret, other = b"k" * 32, b"x" * 32
    frame = encode_frame(0, 1, "result", {"type": "int"}, b"\x80\x04K\x07.")
    reader = SignedFrameReader(secret)
    assert reader.feed(b"a login banner\n" + AGENT_MAGIC + sign_frame(secret, 1, frame)) == [
        ({"v": 1, "rank": 0, "seq": 1, "time": pytest.approx(time.monotonic(), abs=60), "kind": "result",
          "data": {"type": "int"}}, b"\x80\x04K\x07.")]
    with pytest.raises(UnverifiedStream, match="frame 2 is not signed"):
        reader.feed(sign_frame(other, 2, frame))
    replayed = SignedFrameReader(secret)
    replayed.feed(AGENT_MAGIC + sign_frame(secret, 1, frame))
    with pytest.raises(UnverifiedStream):
        replayed.feed(sign_frame(secret, 1, frame))  # the same frame again: out of order
    host_0 = SignedFrameReader(node_key(secret, 0))
    with pytest.raises(UnverifiedStream):  # each host has its own key: host 1's frame is not host 0's
        host_0.feed(AGENT_MAGIC + sign_frame(node_key(secret, 1), 1, frame))


@pytest.mark.processes
def test_hosts_arguments_are_checked_before_anything_starts(tmp_path):
    def work():
        return 1

    with pytest.raises(LaunchArgumentError, match="not both"):
        notebook_launcher(work, hosts=HOSTS, hostfile=str(tmp_path / "x"))
    with pytest.raises(LaunchArgumentError, match="lists a host twice"):
        notebook_launcher(work, hosts=["a", "a"])
    with pytest.raises(LaunchArgumentError, match="leave num_nodes and node_rank out"):
        notebook_launcher(work, hosts=HOSTS, node_rank=1, num_nodes=2)
    with pytest.raises(LaunchArgumentError, match="ssh_options is only used with hosts"):
        notebook_launcher(work, ssh_options=["-p", "22"])
    with pytest.raises(LaunchArgumentError, match="start_hosts_with='pdsh': use 'ssh'"):
        notebook_launcher(work, hosts=HOSTS, start_hosts_with="pdsh")
    with pytest.raises(LaunchArgumentError, match="with mpirun, give its own options in mpirun_options"):
        notebook_launcher(work, hosts=HOSTS, start_hosts_with="mpirun", ssh_options=["-p", "22"])
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\nnode-a slots=4\n\nnode-b  # second\n")
    from notebook_launcher.doctor import read_hostfile
    assert read_hostfile(str(hostfile)) == ["node-a", "node-b"]


INTERRUPTED = """
import sys, time, os
from notebook_launcher import notebook_launcher

def sleeper(pid_dir):
    import torch.distributed as dist
    with open(os.path.join(pid_dir, f"rank{dist.get_rank()}.pid"), "w") as out:
        out.write(str(os.getpid()))
    time.sleep(120)

try:
    notebook_launcher(sleeper, args=(sys.argv[1],), num_processes=1, hosts=["127.0.0.1", "127.0.0.2"],
                      ssh_options=sys.argv[2:], device="cpu", display="text")
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


@pytest.mark.processes
def test_an_interrupt_in_the_launching_process_stops_every_host(local_sshd, tmp_path):
    import signal
    import subprocess
    import sys

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    script = tmp_path / "launch.py"
    script.write_text(INTERRUPTED)
    launcher = subprocess.Popen([sys.executable, str(script), str(pid_dir), *local_sshd], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(pid_dir.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = _pids(pid_dir)
        assert len(pids) == 2, launcher.stdout.read() if launcher.poll() is not None else "ranks never started"
        launcher.send_signal(signal.SIGINT)
        output = launcher.communicate(timeout=30)[0]
    finally:
        launcher.kill()
        launcher.wait()
    assert "interrupted" in output, output
    assert _all_gone(pids), "ranks or agents left behind after the interrupt"


@pytest.mark.processes
def test_hosts_written_as_user_at_host_still_meet_on_an_address(local_sshd, tmp_path):
    import getpass

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    user = getpass.getuser()
    result = notebook_launcher(everyone, args=(str(pid_dir),), num_processes=1,
                               hosts=[f"{user}@127.0.0.1", f"{user}@127.0.0.2"], ssh_options=local_sshd,
                               device="cpu", timeout=120, display="text")
    assert result == (0, 2, 1.0)  # the ranks' store is on the address ssh reached, not on "user@host"


def oom_on_the_second_host():
    import torch
    import torch.distributed as dist

    from notebook_launcher import find_executable_batch_size

    rank = dist.get_rank()

    @find_executable_batch_size(starting_batch_size=64)
    def fit(batch_size):
        if rank == 3 and batch_size > 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        total = torch.tensor([float(batch_size)])
        dist.all_reduce(total)  # every rank, on both hosts, at the same size
        return total.item() / dist.get_world_size()

    return fit()


def fails_once(marker):
    import torch.distributed as dist

    if dist.get_rank() == 2 and not os.path.exists(marker):
        open(marker, "w").close()
        raise RuntimeError("a transient failure on the second host")
    return dist.get_rank()


@pytest.mark.processes
def test_an_out_of_memory_error_on_one_host_restarts_every_host_at_the_smaller_size(local_sshd):
    result = notebook_launcher(oom_on_the_second_host, num_processes=2, hosts=HOSTS, ssh_options=local_sshd,
                               device="cpu", timeout=120, display="panel")
    assert result == 32.0  # the all_reduce of the agreed size: every rank ran at 32
    run = last_run()
    assert run.attempts == 2 and [(r["batch_size"], r["new_batch_size"], r["ranks"]) for r in run.oom_retries] == [
        (64, 32, [3])]
    assert run.panel_state["attempt"] == 2 and run.panel_state["batch_size"] == 32
    assert not _agents()


@pytest.mark.processes
def test_max_restarts_restarts_every_host(local_sshd, tmp_path):
    marker = str(tmp_path / "failed-once")
    assert notebook_launcher(fails_once, args=(marker,), num_processes=2, hosts=HOSTS, ssh_options=local_sshd,
                             device="cpu", timeout=120, max_restarts=1, display="text") == 0
    run = last_run()
    assert run.attempts == 2 and sorted(run.exit_codes) == [0, 1, 2, 3]
    assert any("restarting every host (1 of max_restarts=1)" in event.data.get("text", "")
               for event in run.events if event.kind == "restart")


@pytest.mark.processes
def test_a_restart_across_hosts_shows_attempt_2_in_the_panel(local_sshd, tmp_path):
    marker = str(tmp_path / "failed-once")
    notebook_launcher(fails_once, args=(marker,), num_processes=2, hosts=HOSTS, ssh_options=local_sshd,
                      device="cpu", timeout=120, max_restarts=1, display="panel")
    state = last_run().panel_state
    assert state["attempt"] == 2 and state["status"] == "finished"
    assert any("restarting every host (1 of max_restarts=1)" in note for note in state["notes"])
    assert not _agents()


def _mpirun_through(local_sshd) -> list[str]:
    """Open MPI reaches 127.0.0.2 through the test's sshd (its rsh agent is ssh with the fixture's options)."""
    import shlex

    agent = shlex.join(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", *local_sshd])
    return ["--mca", "plm_rsh_agent", agent]


@pytest.mark.processes
def test_mpirun_starts_the_hosts_agents_which_connect_back(local_sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    result = notebook_launcher(everyone, args=(str(pid_dir),), num_processes=2, hosts=HOSTS, device="cpu",
                               timeout=120, display="text", start_hosts_with="mpirun",
                               mpirun_options=_mpirun_through(local_sshd))
    assert result == (0, 4, 6.0)
    run = last_run()
    for rank in range(4):
        assert any(line.startswith(f"rank {rank} of 4 on ") for line in run.output(rank)), run.output()
    assert _all_gone(_pids(pid_dir)), "ranks or agents left behind"


@pytest.mark.processes
def test_with_mpirun_a_killed_rank_ends_the_run_on_every_host(local_sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
    monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(one_rank_is_killed, args=(str(pid_dir),), num_processes=2, hosts=HOSTS, device="cpu",
                          timeout=120, display="text", start_hosts_with="mpirun",
                          mpirun_options=_mpirun_through(local_sshd))
    assert caught.value.rank == 3 and "SIGKILL" in caught.value.failure.type
    assert _all_gone(_pids(pid_dir)), "ranks or agents left behind"


def kills_its_agent():
    import signal
    import time

    import torch.distributed as dist

    if dist.get_rank() == 2:
        os.kill(os.getppid(), signal.SIGKILL)  # the agent of the second host goes away under its ranks
    time.sleep(20)
    return dist.get_rank()


@pytest.mark.processes
def test_a_host_whose_agent_dies_never_reads_as_a_finished_run(local_sshd):
    with pytest.raises((HostFailedError, RankFailedError)) as caught:
        notebook_launcher(kills_its_agent, num_processes=2, hosts=HOSTS, ssh_options=local_sshd, device="cpu",
                          timeout=60, display="text")
    assert "127.0.0.2" in str(caught.value) and last_run().status == "failed"
    assert not _agents()



@pytest.mark.processes
def test_a_new_way_to_start_agents_is_one_class_and_one_line(tmp_path, monkeypatch):
    from notebook_launcher.cluster.starts import AgentEnd, AgentStart
    from notebook_launcher.launchers import HostSettings, launch
    from notebook_launcher.launchers.hosts import AGENT_STARTS
    from notebook_launcher.plan import make_plan

    class StartedHere(AgentStart):
        """Agents started with no SSH: each host's agent runs on this machine, its pipes the channel (both
        hosts are this machine's addresses)."""

        name = "here"
        over_pipes = True
        node_addresses = HOSTS

        def command(self, hosts: list[str], agent: list[str]) -> list[str]:
            return agent

        def env(self) -> None:
            return None

        def problem(self, end: AgentEnd) -> str:
            return f"host {end.host}: its agent exited with code {end.code}"

    monkeypatch.setitem(AGENT_STARTS, "here", lambda settings: StartedHere())
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    plan = make_plan(everyone, (str(pid_dir),), in_workers=True, num_processes=1, num_nodes=2, master_addr=HOSTS[0],
                     device="cpu", timeout=120)
    assert launch(plan, "text", HostSettings(hosts=HOSTS, start_with="here")) == (0, 2, 1.0)
    run = last_run()
    hosts = {event.rank: event.data.get("host") for event in run.events
             if event.kind == STATUS and event.data.get("state") == "starting"}
    assert run.status == "finished" and hosts == {0: "127.0.0.1", 1: "127.0.0.2"}
    assert _all_gone(_pids(pid_dir)), "ranks or agents left behind"
