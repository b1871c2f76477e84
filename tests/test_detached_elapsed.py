"""A detached run's panel, attached after the run began, shows the run's own times: its elapsed time counts from
the run's start (the time of its first event), not from the moment a kernel attached, and a run attached after
its end shows how long it ran. The ranks wait for a file the test writes; the test waits at least ``WAITED_S``
before it attaches, so the run has gone on at least that long, however loaded the machine (lower bounds only).
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import psutil
import pytest
from helpers.kernel import PANEL_MIME, _assert_ok, _panel, _panel_lines, _wait_until, run_cell, running_kernel

pytestmark = [pytest.mark.slow, pytest.mark.kernel]  # a kernel, and the run's supervisor and ranks
GONE_S = 30
RESULT_S = 120
WAITED_S = 2.0


def _ready_then_wait(folder):
    import torch.distributed as dist

    rank = dist.get_rank()
    print(f"rank {rank} ready", flush=True)
    with open(os.path.join(folder, f".rank{rank}"), "w") as out:
        out.write(str(os.getpid()))
    os.replace(os.path.join(folder, f".rank{rank}"), os.path.join(folder, f"rank{rank}.pid"))
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.05)
    return rank


def _pids(folder) -> list[int]:
    return [int((folder / name).read_text()) for name in os.listdir(folder) if name.endswith(".pid")]


def _panel_update(kc, condition) -> dict:
    """The first update of a shown panel (a kernel thread's, after its cell ended) whose state meets
    ``condition``."""
    deadline = time.monotonic() + RESULT_S
    while time.monotonic() < deadline:
        message = kc.get_iopub_msg(timeout=deadline - time.monotonic())
        data = message["content"].get("data") or {}
        if message["msg_type"] == "update_display_data" and PANEL_MIME in data and condition(data[PANEL_MIME]):
            return data[PANEL_MIME]
    raise TimeoutError(f"no panel update met the condition within {RESULT_S} s")


def _plain_text(outputs: list[dict]) -> str:
    """The panel's plain-text fallback, as its latest display or update has it."""
    return [m["content"]["data"]["text/plain"] for m in outputs
            if m["msg_type"] in ("display_data", "update_display_data") and "text/plain" in m["content"]["data"]][-1]


def _all_gone(pids) -> bool:
    return all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in pids)


@pytest.fixture
def supervisor_pid(runs_dir):
    """The run's supervisor, read from its folder once the test started it; killed after the test if it is still
    there (its ranks die with it), so a failing test leaves nothing running."""
    from notebook_launcher.schema.detached_files import process_start

    found = {}

    def read() -> int:
        (run_id,) = os.listdir(runs_dir)
        found.update(json.loads((runs_dir / run_id / "supervisor.json").read_text()))
        return found["pid"]

    yield read
    if found and process_start(found["pid"]) == found["start"]:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(found["pid"])
            process.kill()
            process.wait(GONE_S)


def test_an_attached_panel_counts_from_the_runs_start_live_and_after_its_end(tmp_path, runs_dir, supervisor_pid):
    from notebook_launcher import notebook_launcher
    from notebook_launcher.display.summary import seconds

    folder = tmp_path / "work"
    folder.mkdir()
    run = notebook_launcher(_ready_then_wait, args=(str(folder),), num_processes=2, detach=True, display="text")
    supervisor = supervisor_pid()
    assert _wait_until(lambda: len(_pids(folder)) == 2, RESULT_S)
    ranks = _pids(folder)
    time.sleep(WAITED_S)  # the run has gone on at least this long (each rank printed "ready" before this)
    attach = f"from notebook_launcher import attach\nattach({run.run_id!r})"
    with running_kernel(tmp_path) as (_, kc, _):
        reply, outputs = run_cell(kc, attach, RESULT_S)
        _assert_ok(reply, outputs)
        assert _panel(outputs)["run_id"] == run.run_id
        live = _panel_update(kc, lambda panel: "rank 0 ready" in _panel_lines(panel, 0))  # the state so far came
        assert live["status"] == "running"
        assert live["elapsed"] >= WAITED_S, live["elapsed"]  # not from this kernel's attach
        (ready,) = [line for line in live["ranks"][0]["lines"] if line["text"] == "rank 0 ready"]
        assert live["elapsed"] - ready["t"] >= WAITED_S, (live["elapsed"], ready)  # the line's time in the run
        (folder / "go").write_text("")
        assert run.result(timeout=RESULT_S) == 0
        reply, outputs = run_cell(kc, attach, RESULT_S)  # after the end: drawn from the run log
        _assert_ok(reply, outputs)
        ended = _panel(outputs)
        assert ended["status"] == "finished" and "rank 0 ready" in _panel_lines(ended, 0)
        assert ended["elapsed"] >= WAITED_S, ended["elapsed"]  # the run's duration, not a moment of this kernel
        took = seconds(ended["elapsed"])  # the fallback's headline and the summary say it too
        assert ended["summary"]["title"] == f"Finished in {took}", ended["summary"]
        assert f"finished, 2 ranks on cpu (gloo, fork), {took}" in _plain_text(outputs)
    assert _wait_until(lambda: _all_gone([supervisor, *ranks]), GONE_S), "a process of the run is left"
