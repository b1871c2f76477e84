"""The panel tells a run's story as a user sees it, in a real JupyterLab (Debian's Chromium, Playwright) with
real launches in a real kernel: a steady run, a failure, an out-of-memory retry, a hang that timeout= stops; and a
live hang notice (fed to the panel's state as the watchdog's event, as test_browser_hang.py does).

The live hang card moves on by itself between updates (two samples 3 s apart differ) and is titled with its
verdict; the retry is amber, with a divider where the new attempt starts. Screenshots of each panel go to
tests/output/panel-*.png (the README's are copies of them, in docs/screenshots/).
"""

from __future__ import annotations

import os
import re
import time

import nbformat
import pytest
from browser import OUTPUT_DIR
from nbformat.v4 import new_code_cell, new_notebook
from test_browser_hang import lab  # noqa: F401 - the fixture: JupyterLab with this checkout's extension

pytestmark = pytest.mark.slow

CELLS = ['''\
import logging, time
import torch
import torch.distributed as dist
from notebook_launcher import (LaunchTimeoutError, RankFailedError, find_executable_batch_size, get_logger,
                               notebook_launcher, report)

def steady(steps):
    logger = get_logger("train", log_level="INFO")
    for step in range(1, steps + 1):
        time.sleep(0.05 if dist.get_rank() == 0 else 0.08)
        dist.all_reduce(torch.ones(1))
        report(step=step, total=steps, loss=1.0 / step)
        if step == 10:
            logger.warning("learning rate warm-up ends at step %d", step, main_process_only=False)
    return "done"

def fails():
    if dist.get_rank() == 1:
        raise ValueError("bad value on rank 1")
    time.sleep(30)

def out_of_memory_once():
    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size):
        if batch_size > 32 and dist.get_rank() == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        print(f"training at batch size {batch_size}")
        return batch_size
    return train()

def one_skips_the_all_reduce():
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins
    else:
        time.sleep(120)
''', 'notebook_launcher(steady, args=(40,), num_processes=2, device="cpu")',
    '''\
try:
    notebook_launcher(fails, num_processes=2, device="cpu")
except RankFailedError:
    print("failed as expected")''',
    'notebook_launcher(out_of_memory_once, num_processes=2, device="cpu")',
    '''\
try:
    notebook_launcher(one_skips_the_all_reduce, num_processes=2, device="cpu", hang_warning=2, timeout=25)
except LaunchTimeoutError:
    print("timed out as expected")''', '''\
from notebook_launcher.display.panel import PanelDisplay
from notebook_launcher.display.state import RunState
from notebook_launcher.schema.events import HANG_NOTICE, STATUS, Event

state = RunState("20261201-110000-4242-abcdef", "/tmp/runs/x", "cpu", "gloo", "fork", 2, 2, [0, 1])
panel = PanelDisplay(state)
t0 = state._started
for rank in (0, 1):
    panel.show(Event(rank, 1, t0, STATUS, {"state": "running"}))
panel.show(Event(-1, 1, time.monotonic(), HANG_NOTICE, {  # noticed now, on the run's clock
    "state": "open", "quiet_s": 5.0, "diverged": None, "timeout": 30, "timeout_in": 23.0,
    "verdict": "ranks wait in different collectives: rank 0 in all_reduce #6, rank 1 in barrier #6.",
    "ranks": {"0": {"state": "waiting", "text": "waiting 5 s in all_reduce #6 at cell In[4], line 8", "waited": 5.0},
              "1": {"state": "waiting", "text": "waiting 4 s in barrier #6 at cell In[4], line 10", "waited": 4.0}},
    "stacks": {}, "text": "possible hang: no rank has made progress for 5 s"}))
panel.publish()''']


def _shot(page, index: int, name: str) -> None:
    panel = page.locator(".nl-run").nth(index)
    panel.scroll_into_view_if_needed()
    os.makedirs(OUTPUT_DIR, exist_ok=True)
    panel.screenshot(path=os.path.join(OUTPUT_DIR, name))


def test_the_panel_tells_a_steady_run_a_failure_a_retry_and_a_live_hang_each_once(lab, tmp_path):  # noqa: F811
    from browser import open_notebook

    root, url, browser = lab
    tracker = tmp_path / "settings" / "@jupyterlab" / "notebook-extension"  # (the fixture's settings folder)
    tracker.mkdir(parents=True, exist_ok=True)
    (tracker / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')  # every cell's output in the page
    notebook = new_notebook(cells=[new_code_cell(code) for code in CELLS], metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, str(root / "story.ipynb"))
    page = open_notebook(browser, url, "story.ipynb")
    page.evaluate("async () => { await window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

    page.wait_for_selector("text=timed out as expected", timeout=60_000)
    page.wait_for_selector('.nl-run[data-status="timed out"]', timeout=30_000)
    timed_out = page.locator(".nl-run").nth(3)
    assert timed_out.locator(".nl-failure-title").inner_text().startswith("The run did not finish within timeout=25 s")
    assert timed_out.locator(".nl-hang-card").count() == 0  # the failure tells where each rank was, once
    assert timed_out.locator(".nl-stack").count() == 2
    _shot(page, 3, "panel-timeout.png")

    steady = page.locator(".nl-run").nth(0)
    assert steady.get_attribute("data-status") == "finished"
    assert steady.locator('.nl-rank-count[data-level="WARNING"]').count() == 2
    assert steady.locator("[data-field='attempt']").count() == 0
    assert steady.locator(".nl-balance-legend").is_visible()
    _shot(page, 0, "panel-steady.png")

    failed = page.locator(".nl-run").nth(1)
    assert failed.locator(".nl-failure-title").inner_text() == "Rank 1 failed first: ValueError: bad value on rank 1"
    assert "".join(failed.locator(".nl-failure pre").all_inner_texts()).count('raise ValueError("bad value') == 1
    _shot(page, 1, "panel-failure.png")

    retried = page.locator(".nl-run").nth(2)
    assert retried.get_attribute("data-status") == "finished"
    assert retried.locator("[data-field='attempt']").inner_text() == "attempt 2"
    retry = retried.locator('.nl-rank[data-rank="1"] .nl-line[data-kind="retry"]')
    assert retry.inner_text() == "out of memory at batch size 64: retried at batch size 32"
    amber = retried.locator(".nl-oom .nl-section-title").evaluate("node => getComputedStyle(node).color")
    assert retry.evaluate("node => getComputedStyle(node).color") == amber != "rgb(0, 0, 0)"
    assert retried.locator('.nl-line[data-kind="attempt"]').all_inner_texts() == ["attempt 2 at batch size 32"] * 2
    assert "failed" not in retried.locator(".nl-ranks").inner_text()
    assert retried.locator(".nl-oom-ranks").inner_text() == "out of memory on rank 1"
    _shot(page, 2, "panel-oom-retry.png")

    # a live hang notice, as the watchdog's event makes it (the same state and display a launch uses): the verdict
    # is the title, and the card moves on between updates by the panel's own clock
    live = page.locator('.nl-run .nl-hang[data-live="true"]')
    live.wait_for(timeout=60_000)
    title = live.locator(".nl-hang-verdict").inner_text()
    assert title == "Ranks wait in different collectives: rank 0 in all_reduce #6, rank 1 in barrier #6", title
    when, countdown = live.locator(".nl-hang-when"), live.locator(".nl-hang-timeout")
    first = (when.inner_text(), countdown.inner_text())
    time.sleep(3)
    second = (when.inner_text(), countdown.inner_text())
    quiet = [int(re.search(r"(\d+) s without progress", text)[1]) for text, _ in (first, second)]
    left = [int(re.search(r"will stop it in (\d+) s", text)[1]) for _, text in (first, second)]
    assert quiet[1] > quiet[0] and left[1] < left[0], (first, second)
    assert "timeout=30 s will stop it in" in second[1] and "press stop" in second[1]
    _shot(page, 4, "panel-hang.png")
