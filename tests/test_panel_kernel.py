"""The run panel in a real Jupyter kernel: one output, updated live while the run goes on, saved in its final
state, and shown as text by ``jupyter nbconvert --to markdown``."""

from __future__ import annotations

import html
import os
import subprocess
import sys

import nbformat
import pytest
from helpers.kernel import KERNEL_NAME, PANEL_MIME, _assert_ok, _messages, _shell_reply, running_kernel
from nbformat.v4 import new_code_cell, new_notebook

SLOW_CELL = '''\
import time
from notebook_launcher import notebook_launcher, report

def slow(steps):
    import torch.distributed as dist
    for step in range(1, steps + 1):
        print(f"step {step} on rank {dist.get_rank()}", flush=True)
        report(step=step, total=steps)
        time.sleep(0.1)
    return steps

notebook_launcher(slow, args=(25,), num_processes=2)
'''


@pytest.mark.slow
@pytest.mark.kernel
def test_the_panel_is_one_output_updated_live_and_throttled(tmp_path, runs_dir):
    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir)}
    with running_kernel(tmp_path, env) as (km, kc, kernel):
        msg_id = kc.execute(SLOW_CELL)
        _assert_ok(_shell_reply(kc, msg_id, timeout=120), [])
        shown, updates = [], []
        for msg in _messages(kc.get_iopub_msg, msg_id, 60, "the kernel did not go idle"):
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
            if msg["msg_type"] == "display_data":
                shown.append(msg["content"])
            elif msg["msg_type"] == "update_display_data":
                updates.append(msg["content"])
    assert len(shown) == 1, "one panel per launch"
    display_id = shown[0]["transient"]["display_id"]
    assert all(update["transient"]["display_id"] == display_id for update in updates)
    states = [content["data"][PANEL_MIME] for content in shown + updates]
    elapsed = states[-1]["elapsed"]
    assert elapsed >= 2.5
    # live: the panel showed the run going on, with some ranks' lines and progress before the end
    running = [state for state in states if state["status"] == "running"]
    assert running and any(0 < (state["ranks"][0]["progress"] or {}).get("step", 0) < 25 for state in running)
    assert states[-1]["status"] == "finished" and [s["status"] for s in states].count("finished") == 1
    # throttled: a few updates per second (50 lines and 50 reports arrived), not one per event
    assert 3 <= len(updates) <= 4 * elapsed + 3, len(updates)
    assert [line["text"] for line in states[-1]["ranks"][1]["lines"]] == [f"step {i} on rank 1" for i in range(1, 26)]


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.kernel
def test_the_saved_notebook_keeps_the_final_panel_and_nbconvert_shows_its_text(tmp_path, runs_dir):
    from nbclient import NotebookClient

    notebook = new_notebook(cells=[new_code_cell(SLOW_CELL.replace("args=(25,)", "args=(3,)"))],
                            metadata={"kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3",
                                                     "language": "python"}})
    NotebookClient(notebook, timeout=120, kernel_name=KERNEL_NAME,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    path = tmp_path / "saved.ipynb"
    nbformat.write(notebook, str(path))

    saved = nbformat.read(str(path), as_version=4)
    (panel_output,) = [o for o in saved.cells[0].outputs if o.output_type == "display_data"]
    state = panel_output.data[PANEL_MIME]
    assert state["status"] == "finished" and state["ranks"][0]["progress"]["step"] == 3
    assert set(panel_output.data) == {PANEL_MIME, "text/html", "text/plain"}

    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "markdown", str(path)], check=True,
                   capture_output=True, timeout=120)
    markdown = html.unescape((tmp_path / "saved.md").read_text())
    for line in panel_output.data["text/plain"].splitlines():  # the text fallback is what a markdown export shows
        assert line in markdown
    for rank in (0, 1):
        for step in (1, 2, 3):
            assert f"[rank {rank}] step {step} on rank {rank}" in markdown


@pytest.mark.slow
@pytest.mark.kernel
def test_the_run_panel_notebook_runs_end_to_end(tmp_path):
    from nbclient import NotebookClient

    source = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks",
                          "run_panel.ipynb")
    notebook = nbformat.read(source, as_version=4)
    assert all(cell.outputs == [] for cell in notebook.cells if cell.cell_type == "code")
    NotebookClient(notebook, timeout=180, kernel_name=KERNEL_NAME,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    (panel,) = [o.data[PANEL_MIME] for o in code[0].outputs if o.output_type == "display_data"]
    assert panel["status"] == "finished" and panel["batch_size"] == 32 and len(panel["oom_retries"]) == 1
    assert len(panel["shape_mismatches"]) == 1
    assert [rank["progress"]["step"] for rank in panel["ranks"]] == [30, 30]
    printed = "".join(o.text for o in code[1].outputs if o.output_type == "stream")
    assert printed.startswith("finished at batch size 32 after 1 retry\nshape mismatch: [(0, [4]), (1, [2])]")
    inspector = "".join(o.text for o in code[2].outputs if o.output_type == "stream")
    assert "[rank 1]  WARNING   train: the shape mismatch was caught" in inspector
    assert "root cause" not in inspector and "[rank 0]" not in inspector
    widgets = [o for o in code[2].outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(widgets) == 1
