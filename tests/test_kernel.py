"""notebook_launcher inside real Jupyter kernels (ipykernel, started by nbclient / jupyter_client).

- a launched function's lines reach the launching cell, prefixed by rank, and its return value is displayed;
- a kernel interrupt stops every worker (none left, not even a zombie), raises KeyboardInterrupt in the cell and
  leaves the kernel usable for the next launch;
- scripts/run_notebook.py (``make demo``) runs the quickstart notebook end to end.

Every kernel is shut down in a ``finally``, bounded in time, and the test checks its PIDs are gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time

import nbformat
import psutil
import pytest
from helpers.kernel import (
    KERNEL_NAME,
    PANEL_MIME,
    _assert_ok,
    _iopub_outputs,
    _panel,
    _panel_lines,
    _result,
    _shell_reply,
    _stream,
    _wait_until,
    run_cell,
    running_kernel,
)
from helpers.processes import _kill_leftovers
from nbformat.v4 import new_code_cell, new_notebook

GONE_WITHIN_S = 10
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(REPO_ROOT, "notebooks", "quickstart.ipynb")
RUN_NOTEBOOK = os.path.join(REPO_ROOT, "scripts", "run_notebook.py")


# -- helpers ------------------------------------------------------------------------------------------------------
def _gone(pid: int) -> bool:
    """No process with this PID at all: not running, and not a zombie waiting to be reaped either."""
    return not os.path.exists(f"/proc/{pid}") and not psutil.pid_exists(pid)


# -- (a) output of a launch, in a notebook executed by nbclient ----------------------------------------------------
HELLO_CELL = '''\
import sys
from notebook_launcher import notebook_launcher

def hello(n):
    import torch.distributed as dist
    rank = dist.get_rank()
    for i in range(n):
        print(f"line {i} of rank {rank}")
    print(f"a warning from rank {rank}", file=sys.stderr)
    return {"rank": rank, "world_size": dist.get_world_size(), "lines": n}

notebook_launcher(hello, args=(5,), num_processes=2, start_method=START_METHOD, display=DISPLAY)
'''


@pytest.mark.slow
@pytest.mark.parametrize("start_method,display", [("auto", "auto"), ("spawn", "auto"), ("auto", "text")])
@pytest.mark.kernel
def test_launch_cell_shows_every_rank_lines_and_the_return_value(tmp_path, runs_dir, start_method, display):
    from nbclient import NotebookClient

    notebook = new_notebook(cells=[new_code_cell(f"START_METHOD = {start_method!r}; DISPLAY = {display!r}"),
                                   new_code_cell(HELLO_CELL)],
                            metadata={"kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3",
                                                     "language": "python"}})
    client = NotebookClient(notebook, timeout=60, kernel_name=KERNEL_NAME,
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except Exception as error:  # show what the cell printed before it failed or hung
        pytest.fail(f"{type(error).__name__}: {error}\noutputs so far: {notebook.cells[1].get('outputs')}")

    outputs = notebook.cells[1].outputs
    results = [o for o in outputs if o.output_type == "execute_result"]
    assert len(results) == 1, outputs
    assert results[0].data["text/plain"] == "{'rank': 0, 'world_size': 2, 'lines': 5}"
    assert not [o for o in outputs if o.output_type == "error"]
    assert runs_dir.is_dir() and any(runs_dir.iterdir()), "the kernel did not write its run log where it was told"
    if display == "auto":  # in a kernel: the run panel, one output updated in place, and nothing else
        _assert_hello_panel(outputs)
        return
    stdout = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    stderr = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stderr")
    lines = stdout.splitlines()
    assert lines[0].startswith("notebook_launcher: 2 processes on cpu (gloo), start method "), stdout
    for line in lines[1:]:  # whole lines, never two ranks glued together, each with its own rank's prefix
        match = re.fullmatch(r"\[rank (\d)\] line \d of rank (\d)", line)
        assert match and match.group(1) == match.group(2), f"unexpected line {line!r} in:\n{stdout}"
    for rank in (0, 1):
        assert [line for line in lines if line.startswith(f"[rank {rank}] ")] == [
            f"[rank {rank}] line {i} of rank {rank}" for i in range(5)], stdout
        assert f"[rank {rank}] a warning from rank {rank}\n" in stderr, stderr


def _assert_hello_panel(outputs) -> None:
    assert [o.output_type for o in outputs] == ["display_data", "execute_result"], outputs
    panel = outputs[0].data[PANEL_MIME]
    assert panel["status"] == "finished" and panel["world_size"] == 2 and panel["result"] == {"type": "dict"}
    assert panel["notes"][0].startswith("2 processes on cpu (gloo), start method "), panel["notes"]
    for rank in (0, 1):
        column = panel["ranks"][rank]
        assert column["rank"] == rank and column["status"] == "finished" and column["exit_code"] == 0
        assert [(line["kind"], line["text"]) for line in column["lines"]] == [
            ("stdout", f"line {i} of rank {rank}") for i in range(5)] + [("stderr", f"a warning from rank {rank}")]
    plain = outputs[0].data["text/plain"].splitlines()  # what nbconvert --to markdown shows
    assert plain[0].startswith("Finished in ")  # the verdict first, then the run's line
    assert plain[1].startswith("notebook_launcher run ") and ": finished, 2 ranks on cpu (gloo, " in plain[1]
    for rank in (0, 1):
        assert [line for line in plain if line.startswith(f"[rank {rank}] line ")] == [
            f"[rank {rank}] line {i} of rank {rank}" for i in range(5)]
    html = outputs[0].data["text/html"]
    assert "line 4 of rank 1" in html and "<script" not in html


# -- (b) interrupting the kernel while workers are running ---------------------------------------------------------
STUCK_CELL = '''\
import os, time
import torch
import torch.distributed as dist
from notebook_launcher import last_run, notebook_launcher

def stuck(pid_dir, how):
    rank = dist.get_rank()
    print(f"rank {rank} started as pid {os.getpid()}", flush=True)
    path = os.path.join(pid_dir, f"rank{rank}.pid")
    with open(path + ".tmp", "w") as out:
        out.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    if how == "all_reduce" and rank == 0:
        dist.all_reduce(torch.ones(1))  # blocks inside gloo: rank 1 never joins
    while True:
        time.sleep(0.05)

notebook_launcher(stuck, args=(PID_DIR, HOW), num_processes=2, start_method=START_METHOD)
'''

AGAIN_CELL = '''\
def again(x):
    import torch
    import torch.distributed as dist
    t = torch.tensor([x * (dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"sum is {t.item()}")
    return t.item()

notebook_launcher(again, args=(7.0,), num_processes=2)
'''


@pytest.mark.slow
@pytest.mark.parametrize("how,start_method", [
    ("sleep", "fork"),
    ("all_reduce", "fork"),
    ("sleep", "spawn"),
])
@pytest.mark.processes
@pytest.mark.kernel
def test_interrupt_stops_every_worker_and_the_kernel_stays_usable(tmp_path, runs_dir, how, start_method):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir)}
    workers: list[psutil.Process] = []
    with running_kernel(tmp_path, env) as (km, kc, kernel):
        try:
            _assert_ok(*run_cell(kc, f"PID_DIR = {str(pid_dir)!r}; HOW = {how!r}; START_METHOD = {start_method!r}"))
            msg_id = kc.execute(STUCK_CELL)
            pid_files = [pid_dir / f"rank{rank}.pid" for rank in (0, 1)]
            if not _wait_until(lambda: all(path.exists() for path in pid_files), timeout=60):
                early_reply = None
                with contextlib.suppress(TimeoutError):
                    early_reply = _shell_reply(kc, msg_id, timeout=1)["content"]
                pytest.fail(f"the workers never started; kernel alive: {km.is_alive()}; reply: {early_reply}")
            pids = [int(path.read_text()) for path in pid_files]
            workers = [psutil.Process(pid) for pid in pids]
            assert set(pids) <= {child.pid for child in kernel.children(recursive=True)}
            time.sleep(0.2)  # rank 0 is in all_reduce by now in that variant (or sleeping): interrupt mid-run

            km.interrupt_kernel()
            reply = _shell_reply(kc, msg_id, timeout=30)
            outputs = _iopub_outputs(kc, msg_id, timeout=30)
            assert reply["content"]["status"] == "error", reply["content"]
            assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
            panel = _panel(outputs)
            assert panel["status"] == "interrupted" and panel["failure"]["kind"] == "interrupted", panel
            for rank, pid in enumerate(pids):
                assert f"rank {rank} started as pid {pid}" in _panel_lines(panel, rank), panel

            still_there = lambda: [pid for pid in pids if not _gone(pid)]  # noqa: E731
            assert _wait_until(lambda: not still_there(), timeout=GONE_WITHIN_S), (
                f"workers still exist {GONE_WITHIN_S} s after the interrupt: "
                + ", ".join(f"{pid} ({_status(pid)})" for pid in still_there()))
            assert km.is_alive()
            assert kernel.children(recursive=True) == [], "the kernel has leftover child processes"

            reply, outputs = run_cell(kc, "print(last_run().status)")
            _assert_ok(reply, outputs)
            assert _stream(outputs) == "interrupted\n"

            reply, outputs = run_cell(kc, AGAIN_CELL)
            _assert_ok(reply, outputs)
            assert _result(outputs) == "21.0", outputs
            panel = _panel(outputs)
            assert panel["status"] == "finished"
            assert _panel_lines(panel, 0) == _panel_lines(panel, 1) == ["sum is 21.0"]
            assert kernel.children(recursive=True) == [], "the second launch left child processes"
        finally:
            _kill_leftovers(workers)


def _status(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.Error as error:
        return type(error).__name__


# -- (c) scripts/run_notebook.py, what `make demo` runs ------------------------------------------------------------
def _run_script(args: list[str], cwd, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run a Python script; if it overruns, kill it and everything it started (its kernel), by PID."""
    process = subprocess.Popen([sys.executable, *args], cwd=str(cwd), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = []
        with contextlib.suppress(psutil.Error):
            tree = psutil.Process(process.pid).children(recursive=True)
        process.kill()
        _kill_leftovers(tree)
        stdout, stderr = process.communicate(timeout=10)
        pytest.fail(f"{args} ran for more than {timeout} s:\n{stdout}\n{stderr}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _output_text(output) -> str:
    """The text an output carries: a stream's text, or a display's text/plain (what a file reader sees)."""
    if output.output_type == "stream":
        return output.text
    return output.get("data", {}).get("text/plain", "")


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.kernel
def test_run_notebook_script_runs_the_quickstart(tmp_path):
    notebook_path = tmp_path / "quickstart.ipynb"
    shutil.copy(QUICKSTART, notebook_path)

    done = _run_script([RUN_NOTEBOOK, str(notebook_path)], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "held-out accuracy" in done.stdout
    executed_path = tmp_path / "quickstart.executed.ipynb"
    assert executed_path.exists()

    executed = nbformat.read(str(executed_path), as_version=4)
    assert all(not [o for o in cell.outputs if o.output_type == "error"]
               for cell in executed.cells if cell.cell_type == "code")
    text = "\n".join(_output_text(output) for cell in executed.cells if cell.cell_type == "code"
                     for output in cell.outputs)
    progress = re.findall(r"^\[rank (\d)\] epoch (\d+)/(\d+) +loss [\d.]+ +samples seen (\d+)$", text, re.MULTILINE)
    epochs = {rank: [int(epoch) for r, epoch, _, _ in progress if r == rank] for rank in ("0", "1")}
    total = int(progress[-1][2]) if progress else 0
    assert total >= 1 and epochs["0"] == epochs["1"] == list(range(1, total + 1)), text
    for rank in ("0", "1"):
        seen = [int(s) for r, _, _, s in progress if r == rank]
        assert seen == sorted(seen) and seen[0] > 0, text  # samples seen grows every epoch


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.kernel
def test_run_notebook_script_fails_on_a_failing_cell_and_still_saves(tmp_path):
    notebook = new_notebook(cells=[new_code_cell("print('before')"), new_code_cell("raise ValueError('boom')"),
                                   new_code_cell("print('never')")],
                            metadata={"kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3",
                                                     "language": "python"}})
    path = tmp_path / "broken.ipynb"
    nbformat.write(notebook, str(path))

    done = _run_script([RUN_NOTEBOOK, str(path)], cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "before" in done.stdout and "ValueError" in done.stdout and "boom" in done.stdout
    executed = nbformat.read(str(tmp_path / "broken.executed.ipynb"), as_version=4)
    assert [o.output_type for o in executed.cells[1].outputs] == ["error"]
    assert executed.cells[2].outputs == []


def test_quickstart_is_committed_with_cleared_outputs():
    notebook = nbformat.read(QUICKSTART, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == KERNEL_NAME
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]


@pytest.mark.slow
@pytest.mark.kernel
def test_a_failed_launch_shows_the_users_frames_and_none_of_the_launchers(tmp_path):
    from nbclient import NotebookClient

    cell = ("from notebook_launcher import notebook_launcher\n"
            "def broken():\n"
            "    raise ValueError('a bad batch')\n"
            "notebook_launcher(broken, num_processes=2, display='text')\n")
    notebook = new_notebook(cells=[new_code_cell(cell)],
                            metadata={"kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3",
                                                     "language": "python"}})
    NotebookClient(notebook, timeout=120, kernel_name=KERNEL_NAME, allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    (error,) = [o for o in notebook.cells[0].outputs if o.output_type == "error"]
    assert error.ename == "RankFailedError" and "a bad batch" in error.evalue
    shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error.traceback))
    assert "notebook_launcher(broken" in shown  # the user's line
    for ours in ("launcher.py", "driver.py", "local.py"):
        assert f"notebook_launcher/{ours}" not in shown and f"launchers/{ours}" not in shown, shown
