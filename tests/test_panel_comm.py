"""The live panel's comm in a real kernel (ipykernel, jupyter_client): opened on a subshell while the launching
cell runs, as JupyterLab opens it, it gets the full state once and then deltas that rebuild every rank's count of
lines as the run log has it; the MIME output meanwhile is refreshed rarely."""

from __future__ import annotations

import json
import os
import queue
import time

import pytest
from helpers.kernel import PANEL_MIME, running_kernel

from notebook_launcher.display.comm import unpack
from notebook_launcher.display.delta import apply_delta
from notebook_launcher.display.panel import REFRESH_S

pytestmark = [pytest.mark.slow, pytest.mark.kernel]

RANKS = 16
CELL = f'''\
import os, time
from notebook_launcher import notebook_launcher

def chatty(seconds):
    rank = int(os.environ["RANK"])
    for i in range(int(seconds * 20)):
        print(f"rank {{rank}} line {{i}}", flush=True)
        time.sleep(0.05)
    return rank

notebook_launcher(chatty, args=(6,), num_processes={RANKS}, device="cpu", display="panel")
print(__import__("notebook_launcher").last_run().run_dir)
'''


def _control(kc, msg_type: str) -> dict:
    msg = kc.session.msg(msg_type, {})
    kc.control_channel.send(msg)
    while True:
        reply = kc.control_channel.get_msg(timeout=20)
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return reply["content"]


def test_a_comm_opened_during_the_run_gets_the_state_then_deltas_with_every_line(tmp_path, runs_dir):
    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir)}
    with running_kernel(tmp_path, env) as (km, kc, kernel):
        subshell = _control(kc, "create_subshell_request")["subshell_id"]
        msg_id = kc.execute(CELL)
        comm_messages, mime, run_id, opened_at, run_dir = [], [], None, None, None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind in ("display_data", "update_display_data") and PANEL_MIME in content["data"]:
                mime.append((time.monotonic(), content["data"]))
                if run_id is None:  # the panel is there: open its comm, as the extension does, over the subshell
                    run_id = content["data"][PANEL_MIME]["run_id"]
                    request = kc.session.msg("comm_open", {"comm_id": "panel-1", "target_name": "notebook_launcher.panel",
                                                           "data": {"run_id": run_id}})
                    request["header"]["subshell_id"] = subshell
                    kc.shell_channel.send(request)
                    opened_at = time.monotonic()
            elif kind == "comm_msg" and content["comm_id"] == "panel-1":
                comm_messages.append((time.monotonic(), unpack(content["data"], msg.get("buffers"))))
            elif kind == "stream" and msg["parent_header"].get("msg_id") == msg_id and "runs" in content["text"]:
                run_dir = content["text"].strip()
            elif kind == "status" and content["execution_state"] == "idle" and \
                    msg["parent_header"].get("msg_id") == msg_id:
                break
    assert run_dir, "the cell did not finish"
    first_at, full = comm_messages[0]
    assert full["type"] == "full" and first_at - opened_at < 2.0  # answered while the cell still ran
    assert full["state"]["status"] in ("starting", "running")
    seen = {**full["state"], "seq": full["seq"]}
    deltas = [data for _, data in comm_messages[1:]]
    for delta in deltas:
        assert delta["base"] == seen["seq"]
        seen = apply_delta(seen, delta, full["caps"])
    assert seen["status"] == "finished"
    counts = {}
    with open(os.path.join(run_dir, "events.jsonl")) as log:
        for line in log:
            event = json.loads(line)
            if event.get("kind") == "stream":
                counts[event["rank"]] = counts.get(event["rank"], 0) + 1
    assert {rank["rank"]: rank["lines_total"] for rank in seen["ranks"]} == counts == {r: 120 for r in range(RANKS)}
    for rank in seen["ranks"]:
        numbers = [line["n"] for line in rank["lines"]]
        assert numbers == sorted(numbers) and rank["lines"][-1]["text"] == f"rank {rank['rank']} line 119"
    during = [data for at, data in mime if at > first_at and data[PANEL_MIME]["status"] == "running"]
    assert len(during) <= 6 / REFRESH_S + 1  # the MIME output: rare while a panel listens
    assert len(deltas) >= 4 * 4  # several a second while lines arrive
    assert mime[-1][1][PANEL_MIME]["status"] == "finished"


HELD_CELL = '''\
import os, time
from notebook_launcher import notebook_launcher

def ticking(seconds):
    rank = int(os.environ["RANK"])
    for i in range(int(seconds * 10)):
        print(f"rank {rank} line {i}", flush=True)
        time.sleep(0.1)
    return rank

notebook_launcher(ticking, args=(5,), num_processes=2, device="cpu", display="panel")
'''


def test_the_runs_own_comm_answers_every_request_while_the_cell_runs_and_publishes_no_status(tmp_path, runs_dir):
    """As the extension does now: no comm_open, no subshell; ``{"want": "full"}`` on the run's own comm (its id
    from the run id), over the main shell, busy with the cell. Each request is answered while the run goes on,
    and no status but the cell's own reaches IOPub until the cell is done (JupyterLab's indicator stays busy)."""
    from notebook_launcher.display.comm import run_comm_id

    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir)}
    with running_kernel(tmp_path, env) as (km, kc, kernel):
        msg_id = kc.execute(HELD_CELL)
        comm_id, asked, answers, fulls, statuses, seen = None, [], [], 0, [], None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                msg = kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                msg = None
            now = time.monotonic()
            if comm_id is not None and len(asked) < 5 and now - (asked[-1] if asked else 0) > 0.7:
                request = kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {"want": "full"}})
                kc.shell_channel.send(request)
                asked.append(now)
            if msg is None:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status":
                statuses.append((msg["parent_header"].get("msg_type"), content["execution_state"]))
                if content["execution_state"] == "idle" and msg["parent_header"].get("msg_id") == msg_id:
                    break
            elif kind == "display_data" and PANEL_MIME in content["data"] and comm_id is None:
                comm_id = run_comm_id(content["data"][PANEL_MIME]["run_id"])
            elif kind == "comm_msg" and content["comm_id"] == comm_id:
                data = unpack(content["data"], msg.get("buffers"))
                if data["type"] == "full":
                    fulls += 1
                    answers.append((now, data["state"]["status"]))
                    seen = {**data["state"], "seq": data["seq"]}
                    caps = data["caps"]
                elif seen is not None and data["type"] == "delta" and data["base"] == seen["seq"]:
                    seen = apply_delta(seen, data, caps)
    assert len(asked) == 5 and fulls == 5, (asked, answers)  # every request answered ...
    assert all(status in ("starting", "running") for _, status in answers)  # ... while the run went on
    assert statuses == [("execute_request", "busy"), ("execute_request", "idle")], statuses
    assert seen["status"] == "finished"
    assert [line["text"] for line in seen["ranks"][1]["lines"]][-1] == "rank 1 line 49"
