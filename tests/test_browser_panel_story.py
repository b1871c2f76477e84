"""The panel tells a run's story as a user sees it, in a real JupyterLab (Debian's Chromium, Playwright) with
real launches in a real kernel: a steady run, a failure, an out-of-memory retry, and a hang (rank 1 skips an
all_reduce) that timeout= stops.

The cells run without the test waiting for them (awaited, JupyterLab's run-all command returns once every cell
is done), in JupyterLab's default windowing mode, so the panel is sampled while the hung launch is still running:
its live hang card is titled with the verdict and its seconds move on by themselves (two samples 3 s apart
differ), then the same panel shows the timed-out run. The retry is amber, with a divider where the new attempt
starts. Screenshots of each panel go to tests/output/panel-*.png, and with NOTEBOOK_LAUNCHER_SCREENSHOTS_TO_DOCS=1
to docs/screenshots/ (the README's).
"""

from __future__ import annotations

import os
import re
import time

import nbformat
import pytest
from helpers.browser import OUTPUT_DIR, command, open_notebook, to_docs
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.slow

TIMEOUT_S = 30

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

def one_skips_an_all_reduce():
    for _ in range(5):
        dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins it
    dist.barrier()
''', 'notebook_launcher(steady, args=(40,), num_processes=2, device="cpu")',
    '''\
try:
    notebook_launcher(fails, num_processes=2, device="cpu")
except RankFailedError:
    print("failed as expected")''',
    'notebook_launcher(out_of_memory_once, num_processes=2, device="cpu")',
    f'''\
try:
    notebook_launcher(one_skips_an_all_reduce, num_processes=2, device="cpu", hang_warning=5, timeout={TIMEOUT_S})
except LaunchTimeoutError:
    print("timed out as expected")''']

VERDICT = "Ranks wait in different collectives: rank 0 in all_reduce #6, rank 1 in barrier #6"
HANG_CELL = ".jp-Notebook .jp-CodeCell >> nth=4"
HANG_PANEL = f"{HANG_CELL} >> .nl-run"
WAIT_MS = 180_000  # for what the cells do before the hang (the other launches, kernel start on a loaded machine)


def _shot(panel, name: str) -> None:
    """The panel's screenshot in tests/output/ (and docs/screenshots/ when asked: ``to_docs``)."""
    panel.scroll_into_view_if_needed()
    os.makedirs(OUTPUT_DIR, exist_ok=True)
    path = os.path.join(OUTPUT_DIR, name)
    panel.screenshot(path=path)
    to_docs(path, name)


def _hang_sample(card) -> tuple[int, int]:
    """(seconds without progress, seconds until timeout= stops it), as the live card reads now."""
    when, countdown = card.locator(".nl-hang-when").inner_text(), card.locator(".nl-hang-timeout").inner_text()
    assert "press stop" in countdown, countdown
    return (int(re.search(r"(\d+) s without progress", when)[1]),
            int(re.search(rf"timeout={TIMEOUT_S} s will stop it in (\d+) s", countdown)[1]))


def test_the_panel_tells_a_steady_run_a_failure_a_retry_and_a_live_hang_each_once(lab):  # noqa: F811
    root, url, browser = lab
    notebook = new_notebook(cells=[new_code_cell(code) for code in CELLS], metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, str(root / "story.ipynb"))
    page = open_notebook(browser, url, "story.ipynb")
    command(page, "notebook:run-all-cells", wait=False)  # (awaited, it would return once every cell is done)

    # the real hang, while its cell runs: the live card or, if it never came, the end of the run
    page.wait_for_function("""() => {
        const cell = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[4];
        const run = cell && cell.querySelector('.nl-run');
        return run && (run.querySelector('.nl-hang[data-live="true"] .nl-hang-timeout')
                       || !['running', 'starting'].includes(run.dataset.status)); }""", timeout=WAIT_MS)
    hung = page.locator(HANG_PANEL)
    assert hung.get_attribute("data-status") == "running"
    live = hung.locator('.nl-hang[data-live="true"]')
    assert live.locator(".nl-hang-verdict").inner_text() == VERDICT
    first = _hang_sample(live)
    time.sleep(3)
    second = _hang_sample(live)
    assert hung.get_attribute("data-status") == "running", "the run ended before the second sample"
    assert second[0] > first[0] and second[1] < first[1], (first, second)
    kernel = "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status"
    assert page.evaluate(kernel) == "busy"  # following the run live never shows the kernel idle while it runs
    _shot(hung, "panel-hang.png")

    # (the output's text: the cell's source, in the page too, says "timed out as expected" from the start)
    page.locator(f"{HANG_CELL} >> .jp-OutputArea-output >> text=timed out as expected").wait_for(timeout=WAIT_MS)
    assert hung.get_attribute("data-status") == "timed out"
    assert hung.locator(".nl-failure-title").inner_text().startswith(
        f"The run did not finish within timeout={TIMEOUT_S} s")
    assert hung.locator(".nl-hang-card").count() == 0  # the failure tells where each rank was, once
    assert hung.locator(".nl-stack").count() == 2
    _shot(hung, "panel-timeout.png")

    panels = page.locator(".nl-run")
    assert panels.count() == 4
    steady = panels.nth(0)
    assert steady.get_attribute("data-status") == "finished"
    assert steady.locator('.nl-rank-count[data-level="WARNING"]').count() == 2
    assert steady.locator("[data-field='attempt']").count() == 0
    assert steady.locator(".nl-balance-legend").is_visible()
    _shot(steady, "panel-steady.png")

    failed = panels.nth(1)
    assert failed.locator(".nl-failure-title").inner_text() == "Rank 1 failed first: ValueError: bad value on rank 1"
    assert "".join(failed.locator(".nl-failure pre").all_inner_texts()).count('raise ValueError("bad value') == 1
    _shot(failed, "panel-failure.png")

    retried = panels.nth(2)
    assert retried.get_attribute("data-status") == "finished"
    assert retried.locator("[data-field='attempt']").inner_text() == "attempt 2"
    retry = retried.locator('.nl-rank[data-rank="1"] .nl-line[data-kind="retry"]')
    assert retry.inner_text() == "out of memory at batch size 64: retried at batch size 32"
    amber = retried.locator(".nl-oom .nl-section-title").evaluate("node => getComputedStyle(node).color")
    assert retry.evaluate("node => getComputedStyle(node).color") == amber != "rgb(0, 0, 0)"
    assert retried.locator('.nl-line[data-kind="attempt"]').all_inner_texts() == ["attempt 2 at batch size 32"] * 2
    assert "failed" not in retried.locator(".nl-ranks").inner_text()
    assert retried.locator(".nl-oom-ranks").inner_text() == "out of memory on rank 1"
    _shot(retried, "panel-oom-retry.png")
