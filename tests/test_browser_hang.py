"""The hang card in a real JupyterLab, in Debian's Chromium (Playwright), with a real kernel.

The kernel's watchdog is what makes ``hang_notice`` events; here the cell makes them by hand, feeds them to a
``RunState`` and publishes it through ``PanelDisplay`` (the same bundle, display id and updates as a launch), so
the card is drawn by the extension built in this checkout. Screenshots go to tests/output/. A real hung launch,
sampled while its cell runs, is in test_browser_panel_story.py.
"""

from __future__ import annotations

import json

import nbformat
import pytest
from helpers.browser import open_notebook, screenshot
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.slow


HANG_CELL = '''\
from notebook_launcher.display.panel import PanelDisplay
from notebook_launcher.display.state import RunState
from notebook_launcher.schema.events import HANG_NOTICE, PROGRESS, STATUS, STREAM, Event

state = RunState("20261201-110000-4242-abcdef", "/tmp/runs/20261201-110000-4242-abcdef", "cpu", "gloo", "fork",
                 2, 2, [0, 1])
panel = PanelDisplay(state)
t0 = state._started
for rank in (0, 1):
    panel.show(Event(rank, 1, t0 + 0.1, STATUS, {"state": "starting", "pid": 4100 + rank}))
    panel.show(Event(rank, 2, t0 + 0.5, STATUS, {"state": "running"}))
    for step in range(1, 5 - rank):
        panel.show(Event(rank, 2 + step, t0 + step, STREAM, {"stream": "stdout", "text": f"step {step}"}))
        panel.show(Event(rank, 10 + step, t0 + step, PROGRESS,
                         {"step": step, "total": 10, "metrics": {"loss": 1 / step}}))
panel.show(Event(-1, 1, t0 + 35.0, HANG_NOTICE, {
    "state": "open", "quiet_s": 31.2, "diverged": 0,
    "ranks": {"0": {"state": "in_ddp", "text": "in DDP's gradient all_reduce (step 4) at train.py:31 in train"},
              "1": {"state": "waiting", "text": "waiting 31 s in barrier #1 at train.py:40 in train <b>x</b>"}},
    "stacks": {"0": 'File "train.py", line 31 in train\\n  loss.backward()',
               "1": 'File "train.py", line 40 in train\\n  dist.barrier()'},
    "text": ("possible hang: no rank made progress for 31 s\\n"
             "  rank 0: in DDP's gradient all_reduce (step 4) at train.py:31 in train\\n"
             "  rank 1: waiting 31 s in barrier #1 at train.py:40 in train <b>x</b>")}))
panel.publish()
'''

CLEAR_CODE = '''\
panel.show(Event(-1, 2, t0 + 41.0, HANG_NOTICE, {"state": "cleared", "quiet_s": 6.0,
                                                  "text": "progress resumed after 6 s"}))
panel.publish()
'''


def _texts(page, selector: str) -> list[str]:
    return [text.strip() for text in page.locator(selector).all_text_contents()]


def test_a_live_hang_notice_is_a_card_on_top_with_rank_badges_and_it_clears_when_progress_resumes(lab):
    root, url, browser = lab
    notebook = new_notebook(cells=[new_code_cell(HANG_CELL)], metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, str(root / "hang.ipynb"))
    page = open_notebook(browser, url, "hang.ipynb")
    page.evaluate("async () => { await window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

    card = page.locator(".nl-run .nl-hang")
    page.wait_for_selector('.nl-run .nl-hang[data-live="true"]', timeout=60_000)
    assert card.locator(".nl-hang-label").inner_text() == "possible hang"
    assert card.locator(".nl-hang-live").is_visible()
    assert page.locator(".nl-run > .nl-header + .nl-hang").count() == 1  # at the top of the run
    assert _texts(page, ".nl-hang-rank .nl-hang-text") == [
        "in DDP's gradient all_reduce (step 4) at train.py:31 in train",
        "waiting 31 s in barrier #1 at train.py:40 in train <b>x</b>"]  # text, never markup
    assert card.locator('.nl-hang-rank[data-rank="0"][data-diverged="true"]').is_visible()
    assert "rank 0 diverged" in card.locator(".nl-hang-diverged").inner_text()
    assert _texts(page, '.nl-run .nl-rank .nl-rank-status') == ["in DDP", "waiting"]
    assert all(page.locator(f'.nl-run .nl-rank[data-rank="{r}"] .nl-rank-status').is_visible() for r in (0, 1))
    stack = card.locator('details.nl-hang-stack[data-rank="1"]')
    assert not stack.locator("pre").is_visible()  # collapsed until asked for
    stack.locator("summary").click()
    assert "dist.barrier()" in stack.locator("pre").inner_text()
    screenshot(page, "hang-card-live.png", ".nl-run")

    # progress resumes: the same output updates in place (its display id), the card stays, not live
    page.evaluate(f"""async () => {{ await window.jupyterapp.shell.currentWidget.sessionContext.session.kernel
                                   .requestExecute({{code: {json.dumps(CLEAR_CODE)}}}).done; }}""")
    page.wait_for_selector('.nl-run .nl-hang[data-live="false"]', timeout=30_000)
    assert card.locator(".nl-hang-ending").inner_text() == "(cleared after 6 s)"
    assert card.locator(".nl-hang-live").count() == 0
    assert "progress resumed after 6 s" in card.locator(".nl-hang-resumed").inner_text()
    assert _texts(page, '.nl-run .nl-rank .nl-rank-status') == ["running", "running"]
    assert stack.locator("pre").is_visible()  # the toggle the user opened stayed open
    screenshot(page, "hang-card-cleared.png", ".nl-run")


UNEVEN_DDP_CELLS = ['''\
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from notebook_launcher import LaunchTimeoutError, notebook_launcher
''', '''\
def uneven_batches():
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    for _ in range(5 if dist.get_rank() == 0 else 3):
        model(torch.ones(8, 4)).sum().backward()
    dist.barrier()
''', '''\
try:
    notebook_launcher(uneven_batches, num_processes=2, device="cpu", timeout=20, hang_warning=None)
except LaunchTimeoutError:
    print("timed out as expected")
''']


def test_the_timeout_card_of_a_ddp_hang_shows_only_the_users_frames_with_the_cell_named(lab):
    """A real launch in the notebook: DDP with uneven batches (rank 0 in DDP's gradient all_reduce, rank 1 in
    barrier) until timeout= stops it. The card's per-rank stacks hold the user's frames and torch's, never ours,
    IPython's, ipykernel's or asyncio's, and the cell is named as IPython names it."""
    root, url, browser = lab
    notebook = new_notebook(cells=[new_code_cell(code) for code in UNEVEN_DDP_CELLS], metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, str(root / "uneven.ipynb"))
    page = open_notebook(browser, url, "uneven.ipynb")
    page.evaluate("async () => { await window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    page.wait_for_selector(".nl-run .nl-stack .nl-stack-text", timeout=120_000)
    page.wait_for_selector("text=timed out as expected", timeout=60_000)
    stacks = _texts(page, ".nl-run .nl-stack .nl-stack-text")
    assert len(stacks) == 2, stacks
    for stack in stacks:
        assert "notebook_launcher" not in stack.replace("frames of notebook_launcher's own", ""), stack
        for machinery in ("IPython", "ipykernel", "asyncio", "/tmp/ipykernel_", "tornado"):
            assert machinery not in stack, stack
        assert "cell In[2], line" in stack, stack  # uneven_batches, defined in the second cell
        assert "frames of notebook_launcher's own below these are not shown" in stack, stack
    assert any("in barrier" in stack for stack in stacks)
    screenshot(page, "timeout-card-ddp.png", ".nl-run")
