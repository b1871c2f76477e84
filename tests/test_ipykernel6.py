"""The live panel and a rank's displays under ipykernel 6 (no subshells, no routing hook for comms), in a real
kernel: a second kernel environment, made of this venv with ipykernel 6 put first on the kernel's path
(``pip install --no-deps --target``: its other requirements are the venv's own, which 6 accepts).

What a user of ipykernel 6 gets, as the README says: the panel's output is live (updated a few times a second
while the run goes on), rank 0's ``display()`` reaches the cell, the kernel indicator stays busy, and a
``{"want": "full"}`` sent while the cell runs is answered once the cell is done, with the final state.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time

import pytest
from helpers.kernel import PANEL_MIME, running_kernel

from notebook_launcher.display.comm import run_comm_id, unpack

pytestmark = [pytest.mark.slow, pytest.mark.processes, pytest.mark.kernel]

IPYKERNEL_6 = "ipykernel==6.31.0"
CELL = '''\
import os, time
import ipykernel
from IPython.display import display
from notebook_launcher import notebook_launcher

def ticking(seconds):
    rank = int(os.environ["RANK"])
    if rank == 0:
        display({"from": "rank 0"}, raw=False)
    for i in range(int(seconds * 10)):
        print(f"rank {rank} line {i}", flush=True)
        time.sleep(0.1)
    return rank

print("ipykernel", ipykernel.__version__)
notebook_launcher(ticking, args=(5,), num_processes=2, device="cpu", display="panel")
'''


@pytest.fixture(scope="session")
def ipykernel6_path():
    """A folder holding ipykernel 6 alone, installed once into the venv's tree (kept between runs)."""
    target = os.path.join(sys.prefix, "ipykernel6")
    if not os.path.exists(os.path.join(target, "ipykernel", "__init__.py")):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target, IPYKERNEL_6],
                       check=True, timeout=600)
    return target


def test_under_ipykernel_6_the_panel_is_live_from_its_output_and_a_request_is_answered_after_the_cell(
        tmp_path, runs_dir, ipykernel6_path):
    python_path = [ipykernel6_path, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir), "PYTHONPATH": os.pathsep.join(python_path)}
    with running_kernel(tmp_path, env) as (km, kc, kernel):
        msg_id = kc.execute(CELL)
        comm_id, asked, statuses, live_updates, outputs, answers, cell_done = None, 0, [], [], [], [], None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not (cell_done and answers):
            try:
                msg = kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            kind, content, parent = msg["msg_type"], msg["content"], msg["parent_header"]
            if kind == "status":
                statuses.append((parent.get("msg_type"), content["execution_state"]))
                if content["execution_state"] == "idle" and parent.get("msg_id") == msg_id:
                    cell_done = time.monotonic()
            elif kind == "stream" and parent.get("msg_id") == msg_id:
                outputs.append(content["text"])
            elif kind == "display_data" and PANEL_MIME in content["data"] and comm_id is None:
                comm_id = run_comm_id(content["data"][PANEL_MIME]["run_id"])
                request = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"want": "full"}})
                kc.shell_channel.send(request)  # while the cell runs, as the panel does
                asked += 1
            elif kind == "update_display_data" and PANEL_MIME in content["data"] and cell_done is None:
                live_updates.append(content["data"][PANEL_MIME]["status"])
            elif kind == "display_data" and parent.get("msg_id") == msg_id:
                outputs.append(content["data"].get("text/plain", ""))
            elif kind == "comm_msg" and content["comm_id"] == comm_id:
                data = unpack(content["data"], msg.get("buffers"))
                answers.append((time.monotonic(), data.get("type"), data.get("state", {}).get("status")))
        assert any(text.startswith("ipykernel 6.") for text in outputs), outputs  # the kernel really is 6
        assert asked == 1 and cell_done, (asked, statuses)
        assert "running" in live_updates, live_updates  # the output itself was updated while the run went on
        assert any("[rank 0] {'from': 'rank 0'}" in text for text in outputs), outputs  # rank 0's display()
        # the indicator: the cell's busy, then idle; nothing in between ends the busy
        cell_statuses = [state for kind, state in statuses if kind == "execute_request"]
        assert cell_statuses == ["busy", "idle"], statuses
        before_idle = statuses[:statuses.index(("execute_request", "idle"))]
        assert all(kind == "execute_request" for kind, _ in before_idle), statuses
        # not answered while the run went on (no subshell, no routing hook): once it was over, with the end state
        assert [answer[1:] for answer in answers] == [("full", "finished")], answers
        reply = kc.execute_interactive("1 + 1", timeout=60)  # the kernel answers afterwards
        assert reply["content"]["status"] == "ok"
