"""Detached runs (``notebook_launcher(..., detach=True)``, ``attach``): a run that outlives its kernel.

In real Jupyter kernels: the launching cell returns while the run goes on and the next cell runs; the kernel is
shut down and the run goes on; a new kernel attaches, shows the panel and gets rank 0's value bit for bit; a
failing run raises the foreground run's ``RankFailedError``; a second kernel stops a run that a first one
follows. Outside kernels: a supervisor killed with SIGKILL leaves no rank and the run reads as lost; what
cannot be detached, and attaching to an unknown, foreign or damaged run, are refused clearly. Every test checks
that no process of the run is left. The ranks wait for a file the test writes (never for a clock), so the order
of what happens is the test's, however loaded the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import psutil
import pytest
from helpers.kernel import (
    PANEL_MIME,
    _assert_ok,
    _panel,
    _shell_reply,
    _stream,
    _wait_until,
    run_cell,
    running_kernel,
)

pytestmark = [pytest.mark.slow, pytest.mark.kernel]  # kernels, and the runs they start
GONE_S = 30
RESULT_S = 120

TRAIN = '''\
import os, time, torch
from notebook_launcher import notebook_launcher

def train(folder, fail=False):
    import torch.distributed as dist
    rank = dist.get_rank()
    open(os.path.join(folder, f".rank{rank}"), "w").write(str(os.getpid()))
    os.replace(os.path.join(folder, f".rank{rank}"), os.path.join(folder, f"rank{rank}.pid"))  # whole, or not there
    torch.manual_seed(7 + rank)
    value = {"weights": torch.randn(64, 32, dtype=torch.float64), "rank": rank}
    dist.all_reduce(value["weights"])
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.05)
    if fail and rank == 1:
        raise ValueError("the loss went to nan on rank 1")
    print(f"rank {rank} finished")
    if rank == 0:
        torch.save(value, os.path.join(folder, "returned.pt"))
    return value
'''


@pytest.fixture(autouse=True)
def _no_supervisor_left(runs_dir):
    """After each test, whatever it asserted: a supervisor of its runs still alive is killed (its ranks die with
    it), so that a failing test leaves nothing running."""
    from notebook_launcher.schema.detached_files import process_start

    yield
    for folder in runs_dir.glob("*/supervisor.json") if runs_dir.exists() else ():
        with contextlib.suppress(psutil.Error, ValueError, KeyError):  # (a damaged file a test wrote: none)
            described = json.loads(folder.read_text())
            if process_start(described["pid"]) == described["start"]:  # (forked from a kernel: its command line)
                process = psutil.Process(described["pid"])
                process.kill()
                process.wait(GONE_S)


def _pids(folder) -> list[int]:
    pids = []
    for name in os.listdir(folder):
        if name.endswith(".pid"):
            pids.append(int(open(os.path.join(folder, name)).read()))
    return pids


def _supervisor(runs_dir) -> int:
    (run_id,) = os.listdir(runs_dir)
    return json.load(open(os.path.join(runs_dir, run_id, "supervisor.json")))["pid"]


def _all_gone(pids) -> bool:
    return all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in pids)


def _assert_nothing_left(pids) -> None:
    assert _wait_until(lambda: _all_gone(pids), GONE_S), f"left running: {[p for p in pids if psutil.pid_exists(p)]}"


def _printed(kc, code: str, timeout: float = 60) -> str:
    reply, outputs = run_cell(kc, code, timeout)
    _assert_ok(reply, outputs)
    return _stream(outputs)


def test_a_detached_run_outlives_its_kernel_and_a_new_kernel_gets_rank_0s_value(tmp_path, runs_dir):
    folder = tmp_path / "work"
    folder.mkdir()
    with running_kernel(tmp_path) as (_, kc, kernel):
        printed = _printed(kc, TRAIN + f"run = notebook_launcher(train, args=({str(folder)!r},), num_processes=2, "
                                       f"detach=True)\nprint(run.status, run.run_id)", timeout=RESULT_S)
        status, run_id = printed.split()[-2:]
        assert status == "running", printed  # the cell ended while the ranks run
        assert _printed(kc, "print(6 * 7, run.status)").split() == ["42", "running"]  # another cell meanwhile
    supervisor = _supervisor(runs_dir)
    ranks = _pids(folder)
    assert psutil.pid_exists(supervisor) and len(ranks) == 2 and not _all_gone(ranks), "the run died with its kernel"
    (folder / "go").write_text("")
    with running_kernel(tmp_path) as (_, kc, _):
        reply, outputs = run_cell(kc, f"from notebook_launcher import attach\nrun = attach({run_id!r})\nrun",
                                  timeout=RESULT_S)
        _assert_ok(reply, outputs)
        assert _panel(outputs)["run_id"] == run_id
        printed = _printed(kc, f"import torch\nvalue = run.result(timeout=None)\n"
                               f"returned = torch.load({str(folder / 'returned.pt')!r})\n"
                               f"same = value['weights'].numpy().tobytes() == returned['weights'].numpy().tobytes()\n"
                               f"print(same, value['rank'], run.status)", timeout=RESULT_S)
        assert printed.split() == ["True", "0", "finished"], printed
    _assert_nothing_left([supervisor, *ranks])
    run_dir = runs_dir / run_id
    assert not (run_dir / "supervisor.sock").exists()
    assert {oct(os.stat(run_dir / name).st_mode & 0o777) for name in ("outcome.json", "result.bin")} == {"0o600"}


CHECKPOINT = '''\
import os, time
from notebook_launcher import notebook_launcher

class Checkpoint:
    def __init__(self, step):
        self.step = step

def train(folder):
    import torch.distributed as dist
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.05)
    return Checkpoint(100 + dist.get_rank())
'''


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:"):
                inodes.add(target)
    return inodes


def test_a_forked_supervisor_holds_no_kernel_socket_and_gives_back_the_notebooks_own_class(tmp_path, runs_dir):
    """Where fork is safe the supervisor is a copy of the kernel: it must hold none of the kernel's sockets (the
    kernel restarts on its ports while the run goes on), and a class of the notebook in rank 0's value comes back
    as the notebook's class: in the launching kernel, and in a new one once the class is defined there again."""
    folder = tmp_path / "work"
    folder.mkdir()
    with running_kernel(tmp_path) as (km, kc, kernel):
        printed = _printed(kc, CHECKPOINT + f"run = notebook_launcher(train, args=({str(folder)!r},), "
                                            f"num_processes=2, detach=True, display='text')\n"
                                            f"print(run.described['start_method'], run.run_id)", timeout=RESULT_S)
        start_method, run_id = printed.split()[-2:]
        assert start_method == "fork", printed
        supervisor = _supervisor(runs_dir)
        assert os.getsid(supervisor) != os.getsid(kernel.pid) and psutil.Process(supervisor).ppid() != kernel.pid
        held = _socket_inodes(supervisor) & _socket_inodes(kernel.pid)
        assert not held, f"the supervisor holds the kernel's sockets {held}"
        ports = {km.shell_port, km.iopub_port, km.stdin_port, km.control_port, km.hb_port}
        assert not [c for c in psutil.Process(supervisor).net_connections() if c.laddr and c.laddr.port in ports]
        km.restart_kernel(now=True)  # the same ports, bound again by the new kernel while the run goes on
        kc.wait_for_ready(timeout=RESULT_S)
        restarted = psutil.Process(km.provisioner.process.pid)
        assert restarted.pid != kernel.pid and psutil.pid_exists(supervisor)
        (folder / "go").write_text("")
        printed = _printed(kc, CHECKPOINT + f"from notebook_launcher import attach\n"
                                            f"value = attach({run_id!r}).result(timeout=None)\n"
                                            f"print(isinstance(value, Checkpoint), value.step)\n"
                                            f"run = notebook_launcher(train, args=({str(folder)!r},), "
                                            f"num_processes=2, detach=True, display='text')\n"
                                            f"value = run.result(timeout=None)\n"
                                            f"print(isinstance(value, Checkpoint), value.step)", timeout=RESULT_S)
        assert printed.split() == ["True", "100", "True", "100"], printed  # a new kernel's, then the launching one's
    _assert_nothing_left([supervisor, _supervisor_of(runs_dir, exclude=run_id), restarted.pid])


def _supervisor_of(runs_dir, exclude: str) -> int:
    (run_id,) = set(os.listdir(runs_dir)) - {exclude}
    return json.load(open(os.path.join(runs_dir, run_id, "supervisor.json")))["pid"]


def test_a_failing_detached_run_raises_the_foreground_runs_error(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "go").write_text("")
    check = (TRAIN + "from notebook_launcher import RankFailedError\nerrors = []\n"
             "for detach in (False, True):\n"
             "    try:\n"
             f"        run = notebook_launcher(train, args=({str(folder)!r}, True), num_processes=2, display='text', "
             "detach=detach)\n"
             "        run.result(timeout=None)\n"
             "    except RankFailedError as error:\n"
             "        errors.append(error)\n"
             "foreground, detached = errors\n"
             "print(detached.rank, detached.failure.type, str(detached).splitlines()[0] == "
             "str(foreground).splitlines()[0], 'the loss went to nan on rank 1' in str(detached))\n")
    with running_kernel(tmp_path) as (_, kc, _):
        printed = _printed(kc, check, timeout=RESULT_S)
        assert printed.splitlines()[-1].split() == ["1", "ValueError", "True", "True"], printed
    _assert_nothing_left(_pids(folder))


def _every_message(kc, code: str, timeout: float = RESULT_S) -> tuple[dict, list[dict]]:
    """``run_cell``, with every iopub message up to its end, whichever cell they belong to (a kernel thread's
    display updates after its cell ended carry no longer that cell's id)."""
    msg_id = kc.execute(code)
    reply = _shell_reply(kc, msg_id, timeout)
    messages, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=deadline - time.monotonic())
        messages.append(msg)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            return reply, messages
    raise TimeoutError(f"the cell did not end within {timeout} s")


def _panels(messages: list[dict]) -> list[tuple[str, dict]]:
    return [(m["content"]["transient"]["display_id"], m["content"]["data"][PANEL_MIME]) for m in messages
            if m["msg_type"] in ("display_data", "update_display_data") and PANEL_MIME in m["content"]["data"]]


def test_two_kernels_follow_one_run_and_the_second_stops_it(tmp_path, runs_dir):
    folder = tmp_path / "work"
    folder.mkdir()
    with running_kernel(tmp_path) as (_, first, _), running_kernel(tmp_path) as (_, second, _):
        reply, outputs = _every_message(first, TRAIN + f"run = notebook_launcher(train, args=({str(folder)!r},), "
                                                       f"num_processes=2, detach=True)\nprint(run.run_id)")
        _assert_ok(reply, outputs)
        run_id = _stream(outputs).split()[-1]
        ((display_id, shown),) = {display_id: panel for display_id, panel in _panels(outputs)}.items()
        assert shown["run_id"] == run_id
        supervisor, ranks = _supervisor(runs_dir), _pids(folder)
        assert _printed(second, f"from notebook_launcher import attach, recent_runs\nrun = attach({run_id!r})\n"
                                f"print(run.status, [r.run_id for r in recent_runs(running=True)])").split() == [
            "running", f"['{run_id}']"]
        assert _printed(second, "run.stop()\nprint(run.status)", timeout=RESULT_S).split() == ["interrupted"]
        reply, outputs = _every_message(first, "try:\n    run.result(timeout=None)\nexcept Exception as error:\n"
                                               "    print(type(error).__name__, error.status)")
        _assert_ok(reply, outputs)
        assert _stream([m for m in outputs if m["msg_type"] == "stream"]).split() == [
            "DetachedRunError", "interrupted"]
        # the launching cell's panel, updated by the kernel's thread after that cell ended: the run's end
        assert [panel["status"] for shown_id, panel in _panels(outputs) if shown_id == display_id][-1] == "interrupted"
    _assert_nothing_left([supervisor, *ranks])


def _train(folder):
    import torch.distributed as dist

    with open(os.path.join(folder, f".rank{dist.get_rank()}"), "w") as out:
        out.write(str(os.getpid()))
    os.replace(os.path.join(folder, f".rank{dist.get_rank()}"), os.path.join(folder, f"rank{dist.get_rank()}.pid"))
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.05)
    return dist.get_rank()


def test_a_supervisor_killed_with_sigkill_leaves_no_rank_and_the_run_reads_lost(tmp_path, runs_dir):
    from notebook_launcher import DetachedRunError, attach, notebook_launcher, recent_runs
    from notebook_launcher.doctor import check_detached_runs

    folder = tmp_path / "work"
    folder.mkdir()
    run = notebook_launcher(_train, args=(str(folder),), num_processes=2, detach=True, display="text")
    assert _wait_until(lambda: len(_pids(folder)) == 2, RESULT_S)
    supervisor, ranks = _supervisor(runs_dir), _pids(folder)
    assert f"1 running: {run.run_id} (supervisor pid {supervisor})" in check_detached_runs().found  # doctor()
    os.kill(supervisor, signal.SIGKILL)
    _assert_nothing_left([supervisor, *ranks])
    with pytest.raises(DetachedRunError, match="was lost") as lost:
        run.result(timeout=RESULT_S)
    assert lost.value.status == "lost" == attach(run.run_id).status
    assert json.load(open(os.path.join(run.run_dir, "outcome.json")))["status"] == "lost"
    assert check_detached_runs().found == "none running" and recent_runs(running=True) == []


@pytest.mark.parametrize(("keywords", "named"), [
    ({"hosts": ["node-a", "node-b"]}, "hosts="),
    ({"num_nodes": 2, "node_rank": 0}, "num_nodes"),
    ({"detach": "yes"}, "detach='yes'"),
])
def test_what_cannot_be_detached_is_refused_before_anything_starts(runs_dir, keywords, named):
    from notebook_launcher import LaunchArgumentError, notebook_launcher

    with pytest.raises(LaunchArgumentError, match=named):
        notebook_launcher(_train, args=("/nonexistent",), num_processes=2, **{"detach": True, **keywords})
    assert not runs_dir.exists() or not os.listdir(runs_dir)


def test_a_function_that_cannot_be_pickled_is_refused_where_the_supervisor_is_spawned(runs_dir):
    import threading

    from notebook_launcher import LaunchArgumentError, notebook_launcher

    lock = threading.Lock()

    def uses_a_lock():
        with lock:
            return 1

    with pytest.raises(LaunchArgumentError, match=r"`lock` \(a lock\).*detach=True"):
        notebook_launcher(uses_a_lock, num_processes=2, detach=True, start_method="spawn")
    assert not runs_dir.exists() or not os.listdir(runs_dir)
    # forked (fork is safe here), nothing is pickled: the function runs as a foreground forked run's does
    run = notebook_launcher(uses_a_lock, num_processes=2, detach=True, display="text")
    assert run.described["start_method"] == "fork" and run.result(timeout=RESULT_S) == 1
    _assert_nothing_left([_supervisor(runs_dir)])


def _cannot_be_rebuilt(text):
    raise RuntimeError(text)


class _LoadsNowhere:
    """Pickles in the kernel; rebuilding it anywhere raises, as an object whose module is not importable does."""

    def __reduce__(self):
        return _cannot_be_rebuilt, ("this object cannot be rebuilt in another process",)


def test_arguments_the_spawned_supervisor_cannot_load_fail_the_launch_in_the_kernel(runs_dir):
    from notebook_launcher import LaunchArgumentError, notebook_launcher

    with pytest.raises(LaunchArgumentError, match=r"(?s)could not load the function and its arguments.*RuntimeError: "
                                                  r"this object cannot be rebuilt in another process\. No run was "
                                                  r"started.*In the supervisor:.*_cannot_be_rebuilt"):
        notebook_launcher(_twice, args=(_LoadsNowhere(),), num_processes=2, detach=True, start_method="spawn",
                          display="text")
    assert not runs_dir.exists() or not os.listdir(runs_dir)  # no run folder: nothing began


def test_attaching_to_an_unknown_damaged_or_foreign_run_is_a_clear_error(runs_dir):
    from notebook_launcher import RunNotFoundError, attach

    with pytest.raises(RunNotFoundError, match="no run .* match"):
        attach("20990101-000000-1-abcdef")
    damaged = runs_dir / "20990101-000000-2-abcdef"
    damaged.mkdir(parents=True, mode=0o700)
    (damaged / "supervisor.json").write_text("{not json")
    os.chmod(damaged / "supervisor.json", 0o600)
    with pytest.raises(RunNotFoundError, match="damaged"):
        attach("20990101-000000-2-abcdef")
    if os.getuid() != 0:
        return  # another user's folder can only be made by root
    foreign = runs_dir / "20990101-000000-3-abcdef"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 4242, 4242)
    with pytest.raises(PermissionError, match="another user"):
        attach("20990101-000000-3-abcdef")


def test_detach_for_stops_a_run_no_kernel_follows_any_more(tmp_path, runs_dir):
    from notebook_launcher import DetachedRunError, attach, notebook_launcher

    folder = tmp_path / "work"
    folder.mkdir()
    run = notebook_launcher(_train, args=(str(folder),), num_processes=2, detach=True, detach_for="1s",
                            display="text")
    supervisor = _supervisor(runs_dir)
    assert _wait_until(lambda: len(_pids(folder)) == 2, RESULT_S)
    run.close()  # the last client goes: a second later the run is stopped
    _assert_nothing_left([supervisor, *_pids(folder)])
    with pytest.raises(DetachedRunError, match="detach_for=1 s passed with no kernel following it"):
        attach(run.run_id).result(timeout=RESULT_S)


@pytest.mark.parametrize(("keywords", "named"), [
    ({"detach_for": "12h"}, "add detach=True"),
    ({"detach": True, "detach_for": "soon"}, "detach_for='soon' is not a duration"),
    ({"detach": True, "detach_for": -5}, "detach_for=-5 is not a duration"),
])
def test_a_wrong_detach_for_is_refused(runs_dir, keywords, named):
    from notebook_launcher import LaunchArgumentError, notebook_launcher

    with pytest.raises(LaunchArgumentError, match=named):
        notebook_launcher(_train, args=("/nonexistent",), num_processes=2, **keywords)
    assert not runs_dir.exists() or not os.listdir(runs_dir)


def test_accelerate_detach_runs_the_cell_detached_and_keeps_what_it_assigns_in_the_run(tmp_path):
    cell = ("%%accelerate -n 2 --detach --text\nimport torch.distributed as dist\n"
            "with lock:\n    answer = dist.get_rank() + 41\n")
    with running_kernel(tmp_path) as (_, kc, _):
        _printed(kc, "%load_ext notebook_launcher\nimport threading\nlock = threading.Lock()")  # (forked: not pickled)
        reply, outputs = run_cell(kc, cell, timeout=RESULT_S)
        _assert_ok(reply, outputs)
        assert _panel(outputs)["run_id"]  # the cell shows the run: its handle, displayed
        printed = _printed(kc, "run = _\nsent = run.result(timeout=None)\nprint(type(run).__name__, "
                               "sorted(sent['values']), 'answer' in globals())", timeout=RESULT_S)
        assert printed.split() == ["DetachedRun", "['answer']", "False"], printed


def test_one_process_runs_detached_in_a_worker(runs_dir):
    from notebook_launcher import notebook_launcher

    run = notebook_launcher(_twice, args=(21,), num_processes=1, detach=True,
                            display="text")
    assert run.result(timeout=RESULT_S) == (42, 1)
    _assert_nothing_left([_supervisor(runs_dir)])


def _twice(x):
    import torch.distributed as dist

    return x * 2, dist.get_world_size()


def test_the_detached_run_notebook_runs_across_a_kernel_restart(tmp_path, runs_dir, repo_root):
    import nbformat

    notebook = nbformat.read(os.path.join(repo_root, "notebooks", "detached_run.ipynb"), as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    after = next(index for index, cell in enumerate(code) if "after-restart" in cell.metadata.get("tags", []))
    with running_kernel(tmp_path) as (_, kc, _):
        for cell in code[:after]:
            reply, outputs = run_cell(kc, cell.source, timeout=RESULT_S)
            _assert_ok(reply, outputs)
    supervisor = _supervisor(runs_dir)
    with running_kernel(tmp_path) as (_, kc, _):  # the restarted kernel
        for cell in code[after:]:
            reply, outputs = run_cell(kc, cell.source, timeout=RESULT_S)
            _assert_ok(reply, outputs)
        assert _stream(outputs).split() == ["finished", "['bias',", "'weight']"]
    _assert_nothing_left([supervisor])


def _large(megabytes):
    import torch

    return torch.zeros(megabytes * 2**20 // 8, dtype=torch.float64)


def test_a_result_the_disk_cannot_hold_fails_clearly(runs_dir):
    """The supervisor may write files of at most 1 MB (RLIMIT_FSIZE, which it inherits: a disk that cannot hold
    more); rank 0 returns 8 MB."""
    import resource

    from notebook_launcher import DetachedRunError, notebook_launcher

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, hard))
    try:
        run = notebook_launcher(_large, args=(8,), num_processes=2, detach=True, display="text", results="rank0")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    with pytest.raises(DetachedRunError, match=r"the run finished, but rank 0's result could not be written to "
                                               r".*File too large") as failed:
        run.result(timeout=RESULT_S)
    assert failed.value.status == "failed" and not os.path.exists(os.path.join(run.run_dir, "result.bin"))
    _assert_nothing_left([_supervisor(runs_dir)])


def _skips_an_all_reduce():
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins it
    dist.barrier()


def _fails_once(folder):
    import torch.distributed as dist

    marker = os.path.join(folder, f"tried{dist.get_rank()}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        dist.barrier()  # (both ranks have marked their first attempt before either fails)
        raise RuntimeError("the first attempt fails")
    return "second attempt"


def test_a_detached_run_is_supervised_as_a_foreground_run(tmp_path, runs_dir):
    """The hang watch's notice, the hang diagnosis and the timeout, max_restarts, and a large result in memory,
    in the supervisor: the same events, errors and results as a foreground run's."""
    from notebook_launcher import LaunchTimeoutError, notebook_launcher

    hung = notebook_launcher(_skips_an_all_reduce, num_processes=2, detach=True, display="text", timeout=10,
                             hang_warning=1)
    with pytest.raises(LaunchTimeoutError, match="all_reduce"):
        hung.result(timeout=RESULT_S)
    assert hung.status == "timed out"
    logged = [json.loads(line) for line in open(os.path.join(hung.run_dir, "events.jsonl"))]
    notices = [event["data"] for event in logged if event.get("kind") == "hang_notice"]
    assert notices and notices[0]["state"] == "open"  # the hang watch's notice, as a foreground run's
    large = notebook_launcher(_large, args=(8,), num_processes=2, detach=True, display="text")
    assert large.result(timeout=RESULT_S).shape == (2**20,)
    logged = [json.loads(line) for line in open(os.path.join(large.run_dir, "events.jsonl"))]
    assert [event["data"].get("in_memory") for event in logged if event.get("kind") == "result"
            and event.get("rank") == 0] == [True]  # rank 0's 8 MB came to the supervisor in memory, not the pipe
    restarted = notebook_launcher(_fails_once, args=(str(tmp_path),), num_processes=2, detach=True, display="text",
                                  max_restarts=1)
    assert restarted.result(timeout=RESULT_S) == "second attempt"
    assert json.load(open(os.path.join(restarted.run_dir, "run.json")))["attempts"] == 2
    _assert_nothing_left([json.loads(path.read_text())["pid"] for path in runs_dir.glob("*/supervisor.json")])


def _waits_for(folder, name):
    import time

    while not os.path.exists(os.path.join(folder, name)):
        time.sleep(0.05)
    return name


def test_a_detached_run_started_while_another_launch_runs_in_a_thread_outlives_that_launch(tmp_path, runs_dir):
    """While a launch's ranks run, the kernel is the subreaper of what they leave; a detached run's supervisor
    started meanwhile is re-parented to it, and must not be taken for what that launch left when it ends."""
    import threading

    from notebook_launcher import notebook_launcher
    from notebook_launcher.schema.detached_files import process_start

    folder = str(tmp_path)
    ended = {}
    foreground = threading.Thread(target=lambda: ended.setdefault("value", notebook_launcher(
        _waits_for, args=(folder, "fg"), num_processes=2, device="cpu", display="text")))
    foreground.start()
    try:
        assert _wait_until(lambda: len(psutil.Process().children()) >= 2, RESULT_S)  # its ranks run
        run = notebook_launcher(_waits_for, args=(folder, "detached"), num_processes=2, detach=True,
                                display="text")
        supervisor = json.load(open(os.path.join(run.run_dir, "supervisor.json")))["pid"]
    finally:
        open(os.path.join(folder, "fg"), "w").close()
        foreground.join(RESULT_S)
    assert ended["value"] == "fg" and run.status == "running"  # that launch's end left the supervisor alone
    assert psutil.pid_exists(supervisor) and psutil.Process(supervisor).status() != psutil.STATUS_ZOMBIE
    open(os.path.join(folder, "detached"), "w").close()
    assert run.result(timeout=RESULT_S) == "detached" and run.status == "finished"
    # ended, and reaped by this process where it had been re-parented here (process_start reaps a child of ours)
    assert _wait_until(lambda: process_start(supervisor) is None and not psutil.pid_exists(supervisor), GONE_S)
    _assert_nothing_left([supervisor])
