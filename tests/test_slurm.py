"""start_hosts_with="srun" against a real two-node Slurm on this machine (the session's ``slurm_cluster``
fixture, tests/slurm_cluster.py): no mock of srun, salloc, squeue or scancel. Inside an allocation the kernel is
tests/slurm_driver.py run under salloc; from outside, the launch is made here, in the test process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import time

import pytest
from helpers.slurm_cluster import RESERVATION, hold_the_nodes, slurm_missing

from notebook_launcher import notebook_launcher
from notebook_launcher.display import TextDisplay
from notebook_launcher.display.panel import PanelDisplay
from notebook_launcher.display.state import RunState
from notebook_launcher.errors import LaunchArgumentError, LaunchTimeoutError, RankFailedError
from notebook_launcher.runs import last_run

pytestmark = pytest.mark.slow
DRIVER = os.path.join(os.path.dirname(__file__), "slurm_driver.py")
CHECKOUT = {"PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}  # this checkout's package


def where_am_i():
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    return {"node": os.environ.get("SLURMD_NODENAME"), "sum": value.item(), "world": dist.get_world_size()}


def fails_on_node_2():
    import time

    import torch.distributed as dist

    if os.environ.get("SLURMD_NODENAME") == "n2" and dist.get_rank() == 3:
        raise ValueError("rank 3 on n2 gives up")
    time.sleep(120)  # the others wait: the launch stops them once rank 3 failed


def sleeps():
    print(f"sleeping on {os.environ.get('SLURMD_NODENAME')}", flush=True)
    time.sleep(300)


def test_the_test_cluster_runs_a_step_on_each_node(slurm):
    done = slurm.run(["srun", "-N2", "--ntasks-per-node=1", "printenv", "SLURMD_NODENAME"], timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["n1", "n2"]


def test_inside_an_allocation_two_ranks_per_node_form_one_group_of_four(slurm):
    """A kernel under ``salloc -N2 --ntasks-per-node=2``: an agent per node by srun, 2 ranks each, one
    all_reduce over 4; rank 0's value back; hosts= narrows to one node; the doctor's Slurm checks."""
    done = slurm.run(["salloc", "-N2", "--ntasks-per-node=2", "--", sys.executable, DRIVER], timeout=400,
                     cwd=os.path.dirname(DRIVER), extra_env=CHECKOUT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{done.stdout}\n{done.stderr}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["rank0"] == {"node": "n1", "sum": 10.0, "world": 4}
    assert result["ranks"] == {"0": "n1", "1": "n1", "2": "n2", "3": "n2"}
    assert result["narrowed"] == {"node": "n2", "sum": 3.0, "world": 2}
    checks = {name: (verdict, found) for name, verdict, found in result["doctor"]}
    assert checks["Slurm job"][0] == "ok" and f"job {result['job']}: 2 node(s)" in checks["Slurm job"][1]
    assert "n1: 2 CPUs" in checks["Slurm job"][1]
    assert checks["srun from here"][0] == "ok" and "n1" in checks["srun from here"][1]


def test_inside_a_step_of_the_job_as_under_batchspawner(slurm):
    """batchspawner runs the notebook server in a step of the job (``srun ... jupyterhub-singleuser``), which
    holds the CPUs of its node: the agents' step overlaps it."""
    done = slurm.run(["salloc", "-N2", "--ntasks-per-node=2", "--", "srun", "-N1", "-n1", "--export=ALL",
                      sys.executable, DRIVER, "once"], timeout=400, cwd=os.path.dirname(DRIVER), extra_env=CHECKOUT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{done.stdout}\n{done.stderr}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["rank0"] == {"node": "n1", "sum": 10.0, "world": 4}
    assert result["ranks"] == {"0": "n1", "1": "n1", "2": "n2", "3": "n2"}


@pytest.mark.processes
def test_from_outside_slurm_options_ask_for_the_allocation_and_give_it_back(slurm, capsys):
    result = notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"],
                               results="all", display="text", timeout=240)
    assert result == {"node": "n1", "sum": 10.0, "world": 4}
    assert {rank: value["node"] for rank, value in last_run().results.items()} == {0: "n1", 1: "n1", 2: "n2",
                                                                                    3: "n2"}
    said = capsys.readouterr().out
    assert "--ntasks-per-node=2" in said and "granted: n1, n2" in said


class _ReleasingPanel(PanelDisplay):
    """The live panel; once it shows the job pending with squeue's reason, the reservation goes."""

    def __init__(self, cluster):
        super().__init__(RunState("test", "", "cpu", "gloo", "fork", 2, 4, list(range(4))))
        self.cluster = cluster
        self.pending_text = None

    def note(self, text: str) -> None:
        super().note(text)
        if "is pending (ReqNodeNotAvail" in text and self.pending_text is None:
            self.pending_text = self.bundle()["text/plain"]
            self.cluster.run(["scontrol", "delete", f"ReservationName={RESERVATION}"])


@pytest.mark.processes
def test_the_panel_shows_the_job_pending_with_its_reason_then_the_run(slurm):
    hold_the_nodes(slurm)
    panel = _ReleasingPanel(slurm)
    result = notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"],
                               display=panel, timeout=240)
    assert result["sum"] == 10.0
    assert panel.pending_text is not None, panel.state.notes
    assert "Slurm job" in panel.pending_text and "is pending (ReqNodeNotAvail" in panel.pending_text
    assert "scancel" in panel.pending_text
    assert any("granted: n1, n2" in note for note in panel.state.notes)


class _InterruptingText(TextDisplay):
    """The text display; SIGINT to this process (a kernel interrupt) once ``ready(text)`` says so."""

    def __init__(self, ready):
        super().__init__("[rank ${rank}] ")
        self.ready = ready
        self.sent = False
        self.seen: list[str] = []

    def _maybe(self, text: str) -> None:
        self.seen.append(text)
        if not self.sent and self.ready(self.seen):
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)

    def note(self, text: str) -> None:
        super().note(text)
        self._maybe(text)

    def show(self, event) -> None:
        super().show(event)
        self._maybe(str(event.data.get("text", "")))


@pytest.mark.processes
def test_an_interrupt_while_the_job_pends_cancels_it(slurm, capsys):
    hold_the_nodes(slurm)
    display = _InterruptingText(lambda seen: any("is pending" in text for text in seen))
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"],
                          display=display, timeout=240)
    assert "cancelled" in capsys.readouterr().out


@pytest.mark.processes
def test_an_interrupt_while_the_ranks_run_stops_every_rank_and_gives_the_job_back(slurm):
    display = _InterruptingText(lambda seen: sum("sleeping on" in text for text in seen) == 4)
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(sleeps, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"],
                          display=display, timeout=240)
    assert display.sent


@pytest.mark.processes
def test_a_timeout_while_the_ranks_run_stops_them_and_gives_the_job_back(slurm):
    started = time.monotonic()
    with pytest.raises(LaunchTimeoutError):
        notebook_launcher(sleeps, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"],
                          display="text", timeout=12)
    assert time.monotonic() - started < 200


@pytest.mark.processes
def test_a_timeout_while_the_job_pends_cancels_it(slurm):
    hold_the_nodes(slurm)
    with pytest.raises(LaunchTimeoutError, match="did not grant the allocation within timeout=8"):
        notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"],
                          display="text", timeout=8)


@pytest.mark.processes
def test_the_kernels_death_gives_the_job_back_and_ends_every_rank(slurm):
    """The kernel SIGKILLed while its ranks run on an allocation it asked for: the holder's input ends, salloc
    gives the job back, the agents' connection ends and they stop their ranks."""
    import subprocess

    kernel = subprocess.Popen([sys.executable, DRIVER, "sleep"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              env={**slurm.client_env(), **CHECKOUT}, text=True,
                              start_new_session=True)
    try:
        seen, deadline = [], time.monotonic() + 240
        while sum("sleeping on" in line for line in seen) < 4 and time.monotonic() < deadline:
            line = kernel.stdout.readline()
            if not line:
                break
            seen.append(line)
        assert sum("sleeping on" in line for line in seen) == 4, "".join(seen)
        assert len(slurm.jobs()) == 1
    finally:
        os.kill(kernel.pid, signal.SIGKILL)
        kernel.wait(timeout=30)
        kernel.stdout.close()


def oom_on_node_2():
    import torch
    import torch.distributed as dist

    from notebook_launcher import find_executable_batch_size

    @find_executable_batch_size(starting_batch_size=64)
    def fit(batch_size):
        if os.environ.get("SLURMD_NODENAME") == "n2" and dist.get_rank() == 3 and batch_size > 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        total = torch.tensor([float(batch_size)])
        dist.all_reduce(total)  # every rank, on both nodes, at the same size
        return total.item() / dist.get_world_size()

    return fit()


@pytest.mark.processes
def test_an_out_of_memory_error_on_node_2_restarts_both_nodes_in_the_same_allocation(slurm, capsys):
    assert notebook_launcher(oom_on_node_2, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"],
                             display="text", timeout=240) == 32.0
    run = last_run()
    assert run.attempts == 2 and [(r["batch_size"], r["new_batch_size"], r["ranks"]) for r in run.oom_retries] == [
        (64, 32, [3])]
    said = capsys.readouterr().out
    assert said.count("asking Slurm for an allocation") == 1 and said.count(" granted: n1, n2") == 1  # one job


@pytest.mark.processes
def test_a_failing_rank_on_node_2_is_named_first(slurm):
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(fails_on_node_2, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"],
                          display="text", timeout=240)
    error = caught.value
    assert error.rank == 3
    assert str(error).startswith("Rank 3 failed first: ValueError: rank 3 on n2 gives up")
    assert "Rank 3 ran on n2 (n1: ranks 0-1; n2: ranks 2-3)" in str(error)


@pytest.mark.processes
def test_a_job_slurm_refuses_is_its_own_message(slurm):
    with pytest.raises(LaunchArgumentError, match="slurm_options=.*refused.*invalid partition specified: nope"):
        notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun",
                          slurm_options=["--nodes=2", "--partition=nope"], display="text", timeout=120)


def test_more_ranks_per_node_than_the_jobs_cpus_run_with_one_warning(slurm):
    """torchrun's pattern under Slurm, one task (here one CPU) per node and several ranks under it: the launch
    runs, and says once that the ranks share the CPUs, with the option that gives each its own."""
    done = slurm.run(["salloc", "-N2", "--ntasks-per-node=1", "--", sys.executable, DRIVER, "shared"], timeout=400,
                     cwd=os.path.dirname(DRIVER), extra_env=CHECKOUT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{done.stdout}\n{done.stderr}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["rank0"] == {"node": "n1", "sum": 10.0, "world": 4}
    warnings = [line for line in result["said"].splitlines() if "warning: num_processes=2 ranks per node" in line]
    assert len(warnings) == 1, result["said"]
    assert f"Slurm job {result['job']} holds on n1 (1), n2 (1)" in warnings[0]
    assert "'--cpus-per-task=2'" in warnings[0] and "'--ntasks-per-node=2'" in warnings[0]


@pytest.mark.processes
def test_salloc_that_ends_once_granted_has_its_job_cancelled(slurm):
    """``--no-shell``: salloc is granted the job and exits without running the launch on it; the job is
    cancelled (the fixture checks squeue is empty) and the message says why."""
    with pytest.raises(LaunchArgumentError, match=r"salloc was granted job \d+ but ended without running the launch "
                                                  r"on it .*the job was cancelled.*--no-shell"):
        notebook_launcher(where_am_i, num_processes=1, start_hosts_with="srun", slurm_options=["--nodes=1",
                          "--no-shell"], display="text", timeout=120)
    assert slurm.wait_no_jobs(30) == []


class _SuspendingText(TextDisplay):
    """The text display; once the job is granted, it is suspended (Slurm then cannot start a step in it)."""

    def __init__(self, cluster):
        super().__init__("[rank ${rank}] ")
        self.cluster = cluster
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        super().note(text)
        self.notes.append(text)
        granted = re.search(r"Slurm job (\d+) granted", text)
        if granted:
            done = self.cluster.run(["scontrol", "suspend", granted.group(1)])
            assert done.returncode == 0, done.stderr


@pytest.mark.processes
def test_a_step_slurm_cannot_start_is_said_then_named_by_the_timeout(slurm, monkeypatch):
    """srun waits without a word while the job is suspended: the launch says which nodes started no rank and
    where to look, once, and the timeout names the job, the nodes and the job's state."""
    from notebook_launcher.launchers import slurm as slurm_launcher

    monkeypatch.setattr(slurm_launcher, "STEP_NOTICE_S", 2.0)
    display = _SuspendingText(slurm)
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(where_am_i, num_processes=1, start_hosts_with="srun", slurm_options=["--nodes=2"],
                          display=display, timeout=15)
    said = [note for note in display.notes if "no rank has started" in note]
    assert len(said) == 1, display.notes
    assert re.search(r"Slurm job \d+: no rank has started on n1, n2 after 2 s \(the job is SUSPENDED\)", said[0])
    assert "squeue -s --jobs=" in said[0] and "an interrupt stops the launch" in said[0]
    assert re.match(r"Slurm job (\d+): its srun step never started a rank on n1, n2 \(the job is SUSPENDED; "
                    r"`scontrol show job \1` says why\)\. The hosts did not finish within timeout=15 s",
                    str(caught.value)), str(caught.value)


def test_the_doctor_outside_a_job_says_srun_works(slurm):
    from notebook_launcher.doctor import doctor

    check = doctor()["Slurm"]
    assert check.verdict == "ok" and "not in a job; srun works from here" in check.found


@pytest.mark.skipif(slurm_missing() is not None, reason=str(slurm_missing()))
@pytest.mark.processes
def test_srun_without_an_allocation_nor_slurm_options_is_refused(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    with pytest.raises(LaunchArgumentError, match="needs a Slurm allocation.*slurm_options"):
        notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun")


@pytest.mark.processes
def test_srun_not_found_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchArgumentError, match="srun is not found"):
        notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"])


@pytest.mark.parametrize("keywords, match", [
    ({"slurm_options": "--nodes=2"}, "slurm_options must be a list"),
    ({"slurm_options": ["--nodes=2-4"]}, "give one number of nodes"),
    ({"slurm_options": ["--nodes=2"], "hosts": ["n1"]}, "name the nodes there"),
    ({"slurm_options": ["--nodes=2"], "ssh_options": ["-p", "22"]}, "ssh_options is not used"),
    ({"slurm_options": ["--nodes=2"], "num_nodes": 2}, "leave num_nodes and node_rank out"),
])
@pytest.mark.skipif(slurm_missing() is not None, reason=str(slurm_missing()))
@pytest.mark.processes
def test_arguments_of_srun_are_checked_before_anything_starts(keywords, match):
    with pytest.raises(LaunchArgumentError, match=match):
        notebook_launcher(where_am_i, num_processes=2, start_hosts_with="srun", **keywords)


@pytest.mark.processes
def test_slurm_options_need_srun():
    with pytest.raises(LaunchArgumentError, match="slurm_options is for start_hosts_with='srun'"):
        notebook_launcher(where_am_i, num_processes=2, hosts=["127.0.0.1"], slurm_options=["--nodes=2"])


def test_slurm_counts_and_options():
    from notebook_launcher.cluster.slurm_job import allocation_options, expand_counts

    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert allocation_options(["--nodes=2"], 2, "cpu") == ["--nodes=2", "--ntasks-per-node=2"]
    assert allocation_options(["-N2", "-c4"], 2, "cpu") == ["-N2", "-c4"]
    assert allocation_options(["-N2"], 2, "cuda") == ["-N2", "--ntasks-per-node=2", "--gpus-per-node=2"]


@contextlib.contextmanager
def _fake_commands(folder, **scripts):
    """Slurm commands in ``folder``, first on PATH while in the block: a ``scancel`` that logs its arguments
    (one line per call, each argument in brackets) then runs the real one, and the given sh ``scripts`` by name
    (``$REAL`` is the real command). Yields the log's path."""
    log = folder / "scancel.log"
    scripts = {"scancel": f'{{ for a in "$@"; do printf "[%s]" "$a"; done; echo; }} >> {log}\nexec "$REAL" "$@"',
               **scripts}
    for name, body in scripts.items():
        path = folder / name
        path.write_text(f"#!/bin/sh\nREAL={shutil.which(name)}\n{body}\n")
        path.chmod(0o755)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
        yield str(log)


def _scancel_calls(log: str) -> list[list[str]]:
    if not os.path.exists(log):
        return []
    with open(log) as file:
        return [re.findall(r"\[(.*?)\]", line) for line in file]


def test_hostile_squeue_output_with_fake_squeue_on_path(slurm, tmp_path):
    """Only ids of steps of ours in the job reach scancel, after ``--``; non-UTF-8 lines are no error."""
    from notebook_launcher.cluster.slurm_job import STEP_NAME, cancel_steps

    done = slurm.run(["salloc", "-N1", "--no-shell"])  # a real job to cancel steps in
    job = re.search(r"Granted job allocation (\d+)", done.stderr).group(1)
    try:
        lines = [f"--user=root {STEP_NAME}", f"{job}.0;id {STEP_NAME}", f"9{job}.3 {STEP_NAME}",
                 f"-{job}.4 {STEP_NAME}", f"{job}.8 other", f"{job}.7 {STEP_NAME}"]
        squeue = "printf '%s\\n' " + " ".join(f"'{line}'" for line in lines) + f"\nprintf '\\377\\376 {STEP_NAME}\\n'"
        with _fake_commands(tmp_path, squeue=squeue) as log:
            assert cancel_steps(job) == [f"{job}.7"]
        assert _scancel_calls(log) == [["--quiet", "--", f"{job}.7"]]
    finally:
        slurm.run(["scancel", job])


@pytest.mark.processes
def test_hostile_slurm_job_id_in_the_environment_with_fake_scancel_on_path(slurm, tmp_path, monkeypatch):
    from notebook_launcher.cluster.slurm_checks import slurm_checks
    from notebook_launcher.errors import HostFailedError

    monkeypatch.setenv("SLURM_JOB_ID", "--user=root")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    with _fake_commands(tmp_path) as log:
        with pytest.raises(HostFailedError, match=r"SLURM_JOB_ID '--user=root' is not a Slurm job or step id"):
            notebook_launcher(where_am_i, num_processes=1, start_hosts_with="srun", display="text", timeout=60)
        check = slurm_checks()[0]
    assert check.verdict == "problem" and "'--user=root' is not a Slurm job" in check.found
    assert _scancel_calls(log) == []


def test_non_utf8_scontrol_output_with_fake_scontrol_on_path(slurm, tmp_path):
    from notebook_launcher.cluster.slurm_job import node_addresses

    scontrol = "\"$REAL\" \"$@\"; code=$?\nprintf 'NodeName=\\377n3 NodeAddr=\\376\\n'; exit $code"
    with _fake_commands(tmp_path, scontrol=scontrol):
        assert node_addresses(["n1", "n2"]) == ["127.0.0.1", "127.0.0.1"]


def test_a_node_list_longer_than_a_command_line_is_read(slurm):
    """300,000 node names (no two alike, so nothing to compress) in SLURM_JOB_NODELIST: the job is read, and
    the nodes' addresses asked of scontrol; node lists expand as ``scontrol show hostnames`` does."""
    from notebook_launcher.cluster.slurm_job import hostnames, job_from_env, node_addresses

    names = [f"gpu{index}-{index * 7919 % 100_003}" for index in range(300_000)]
    job = job_from_env({"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": ",".join([*names, "n[1-2]"]),
                        "SLURM_JOB_CPUS_PER_NODE": "4(x300002)"})
    assert len(job.hosts) == 300_002 and job.hosts[-3:] == [names[-1], "n1", "n2"] and job.cpus["n2"] == 4
    assert node_addresses(job.hosts)[-3:] == [names[-1], "127.0.0.1", "127.0.0.1"]
    for expression in ["n[1-2]", "n[009-011],m3", "rack[1-2]-n[01-02]", "a,b c", "n[8-11,3]"]:
        assert hostnames(expression) == slurm.run(["scontrol", "show", "hostnames", expression]).stdout.split()


@pytest.mark.processes
def test_a_slurm_command_that_does_not_answer_is_killed_with_its_children(tmp_path):
    from notebook_launcher.cluster.slurm_job import SlurmError, run_slurm

    command = tmp_path / "squeue"
    command.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {tmp_path / 'child'}\nwait\n")
    command.chmod(0o755)
    with pytest.raises(SlurmError, match="did not answer in 3 s"):
        run_slurm([str(command)], timeout=3)
    child = int((tmp_path / "child").read_text())
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{child}"), "the command's child was left running"
