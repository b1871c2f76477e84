"""Faults end with every worker gone, nothing leaked, and the true root cause shown."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import pytest
import torch

from notebook_launcher import LaunchTimeoutError, RankFailedError, last_run, notebook_launcher

pytestmark = pytest.mark.processes


def assert_all_workers_gone():
    run = last_run()
    pids = [e.data["pid"] for e in run.events if e.kind == "status" and "pid" in e.data]
    assert pids, "the workers reported their pids"
    for pid in pids:
        assert not psutil.pid_exists(pid), f"worker {pid} is still there"
    assert psutil.Process().children(recursive=True) == []


def raise_while_peer_waits(failing_rank):
    import torch.distributed as dist

    if dist.get_rank() == failing_rank:
        time.sleep(0.2)  # the peers are already blocked in all_reduce
        raise ValueError(f"bad batch on rank {failing_rank}")
    dist.all_reduce(torch.ones(1))
    time.sleep(30)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_root_cause_is_the_raising_rank_not_the_peer_blocked_in_all_reduce(start_method):
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(raise_while_peer_waits, args=(1,), num_processes=3, start_method=start_method,
                          device="cpu")
    error = caught.value
    message = str(error)
    assert message.startswith("Rank 1 failed first: ValueError: bad batch on rank 1")
    assert "raise ValueError(f\"bad batch on rank {failing_rank}\")" in message
    assert "in raise_while_peer_waits" in message
    assert "worker.py" not in message.split("Other ranks:")[0]  # the user's frames, not ours
    assert "rank 0:" in message and "rank 2:" in message
    assert error.rank == 1 and error.run.status == "failed"
    assert_all_workers_gone()


@pytest.mark.parametrize("how, expected_start, exit_code", [
    ("sys.exit(3)", "Rank 1 failed first: SystemExit: the function called sys.exit(3)", 3),
    ("os._exit(7)", "Rank 1 failed first: exit code 7: exited before its function returned", 7),
    ("os.kill(os.getpid(), signal.SIGKILL)", "Rank 1 failed first: killed by SIGKILL", -signal.SIGKILL),
    ("ctypes.string_at(0)", "Rank 1 failed first: killed by SIGSEGV", -signal.SIGSEGV),
])
def test_a_rank_that_exits_or_is_killed_ends_the_run_with_its_cause(how, expected_start, exit_code):
    def die():
        import ctypes  # noqa: F401 - used by the segfault case

        import torch.distributed as dist

        if dist.get_rank() == 1:
            print("about to go")
            exec(how)
        dist.all_reduce(torch.ones(1))
        time.sleep(30)

    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(die, num_processes=2, device="cpu")
    assert time.monotonic() - started < 20  # not the 30 s sleep, not gloo's 30 min timeout
    assert str(caught.value).startswith(expected_start)
    assert last_run().exit_codes[1] == exit_code
    assert_all_workers_gone()


def test_segfault_shows_the_python_stack_of_the_crash():
    def crash():
        import ctypes

        import torch.distributed as dist

        if dist.get_rank() == 0:
            ctypes.string_at(0)
        dist.barrier()

    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(crash, num_processes=2, device="cpu")
    message = str(caught.value)
    assert "Segmentation fault" in message and "in crash" in message
    # as a hang's stacks: the user's frames; the launcher's and those the rank inherited (pytest's) counted
    crash = message.split("stderr:\n", 1)[1].split("\nOther ranks:", 1)[0]
    assert "notebook_launcher" not in crash.replace("frames of notebook_launcher's own", ""), message
    assert "_pytest" not in crash and "frames of notebook_launcher's own below these are not shown" in crash, message


def test_timeout_stops_the_run_and_shows_each_rank_stack():
    def stuck():
        import torch.distributed as dist

        if dist.get_rank() == 0:
            dist.barrier()  # rank 1 never joins
        else:
            time.sleep(60)

    started = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(stuck, num_processes=2, device="cpu", timeout=2)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert message.startswith("The run did not finish within timeout=2 s")
    assert "Python stacks of rank 0" in message and "Python stacks of rank 1" in message
    assert "in stuck" in message
    assert last_run().status == "timed out"
    assert_all_workers_gone()


def test_grandchildren_such_as_dataloader_workers_are_stopped_too(tmp_path):
    pid_file = tmp_path / "grandchild.pid"

    def with_helper_process():
        import torch.distributed as dist

        if dist.get_rank() == 0:
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            pid_file.write_text(str(helper.pid))
            time.sleep(0.5)
            raise RuntimeError("rank 0 gives up")
        time.sleep(30)

    with pytest.raises(RankFailedError):
        notebook_launcher(with_helper_process, num_processes=2, device="cpu")
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_relaunch_right_after_a_failure_works():
    with pytest.raises(RankFailedError):
        notebook_launcher(raise_while_peer_waits, args=(0,), num_processes=2, device="cpu")

    def ok():
        import torch.distributed as dist

        dist.barrier()
        return "second run fine"

    assert notebook_launcher(ok, num_processes=2, device="cpu") == "second run fine"


def test_interrupt_stops_every_worker_and_raises_keyboard_interrupt():
    """What a Jupyter interrupt does: SIGINT to the kernel while the launch is running."""

    def long_running():
        import torch.distributed as dist

        dist.barrier()
        print("started", flush=True)
        time.sleep(60)

    handler_before = signal.getsignal(signal.SIGINT)
    timer = threading.Timer(2.0, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        notebook_launcher(long_running, num_processes=2, device="cpu")
    timer.join()
    assert time.monotonic() - started < 10
    assert last_run().status == "interrupted"
    assert signal.getsignal(signal.SIGINT) is handler_before
    assert_all_workers_gone()


def temp_dirs():
    """Directories in the temp dir (what a launcher would leave, like torch elastic's torchelastic_* dirs)."""
    root = tempfile.gettempdir()
    return {name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name))}


def test_twenty_launches_leak_no_process_fd_or_temp_dir():
    def tiny():
        import torch.distributed as dist

        dist.barrier()
        return 1

    def failing():
        raise RuntimeError("x")

    me = psutil.Process()
    notebook_launcher(tiny, num_processes=2, device="cpu")  # warm-up: lazy imports open their files once
    fds_before = me.num_fds()
    temp_before = temp_dirs()
    handlers_before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD,
                                                        signal.SIGUSR1, signal.SIGHUP)}
    env_before = dict(os.environ)
    for index in range(20):
        if index % 5 == 4:
            with pytest.raises(RankFailedError):
                notebook_launcher(failing, num_processes=2, device="cpu")
        else:
            assert notebook_launcher(tiny, num_processes=2, device="cpu") == 1
    assert me.children(recursive=True) == []
    assert me.num_fds() == fds_before
    assert temp_dirs() - temp_before == set()
    assert {s: signal.getsignal(s) for s in handlers_before} == handlers_before
    assert dict(os.environ) == env_before


def test_a_failure_after_more_output_than_the_run_keeps_in_memory_is_still_reported(monkeypatch):
    from notebook_launcher.launchers import intake

    monkeypatch.setattr(intake, "MAX_BYTES_IN_MEMORY", 5000)

    def chatty_then_fails():
        import torch.distributed as dist

        if dist.get_rank() == 1:
            for index in range(300):
                print(f"line {index}")
            raise ValueError("after a lot of output")
        time.sleep(30)

    with pytest.raises(RankFailedError, match="Rank 1 failed first: ValueError: after a lot of output"):
        notebook_launcher(chatty_then_fails, num_processes=2, device="cpu")
    run = last_run()
    assert run.events_dropped > 0 and run.status == "failed"
    assert any(e.kind == "failure" for e in run.events)  # control events are always kept
