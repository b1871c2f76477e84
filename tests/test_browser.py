"""The run panel, the Runs sidebar and the run inspector in a real JupyterLab, in Debian's Chromium (Playwright).

Screenshots go to tests/output/ (mid-run and final panel, sidebar, inspector).
"""

from __future__ import annotations

import nbformat
import pytest
from helpers.browser import _notebook, command, open_notebook, screenshot

pytestmark = pytest.mark.slow

TRAIN_CELL = '''\
import time
import torch
import torch.distributed as dist
from notebook_launcher import (DistributedOperationException, find_executable_batch_size, get_logger,
                               notebook_launcher, report)

def train(steps):
    rank = dist.get_rank()
    logger = get_logger("train", log_level="INFO")

    @find_executable_batch_size(starting_batch_size=64)
    def fit(batch_size):  # rank 1 runs out of memory at 64: every rank restarts at 32
        if rank == 1 and batch_size > 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size

    batch_size = fit()
    try:  # debug mode: different shapes on the two ranks fail at once, on both
        dist.all_gather_into_tensor(torch.empty(8), torch.ones(4 if rank == 0 else 2))
    except DistributedOperationException:
        logger.warning("caught the shape mismatch", main_process_only=False)
    for step in range(1, steps + 1):
        logger.info(f"step {step} at batch size {batch_size}", main_process_only=False)
        report(step=step, total=steps, loss=1.0 / step)
        time.sleep(0.4)
    return batch_size

notebook_launcher(train, args=(STEPS,), num_processes=2, device="cpu", debug=True)
'''


def _start_training(lab, name: str, steps: int):
    """A notebook running TRAIN_CELL, opened in the browser, its cells started (not awaited: watched live)."""
    root, url, browser = lab
    _notebook(root / name, [f"STEPS = {steps}", TRAIN_CELL])
    page = open_notebook(browser, url, name)
    command(page, "notebook:run-all-cells", wait=False)
    return page


def _rank_lines(page, rank: int) -> list[str]:
    return page.locator(f'.nl-run .nl-rank[data-rank="{rank}"] .nl-line .nl-text').all_inner_texts()


def test_the_live_panel_shows_ranks_shape_errors_and_oom_retries_and_survives_a_reload(lab):
    root = lab[0]
    page = _start_training(lab, "panel.ipynb", steps=12)

    # live: the panel is there, running, with lines and progress, before the run ends
    page.wait_for_selector('.nl-run[data-status="running"] .nl-rank[data-rank="1"] .nl-line', timeout=90_000)
    page.wait_for_function("""() => { const p = document.querySelector('.nl-run .nl-rank[data-rank="0"] .nl-progress');
                                      return p && Number(p.dataset.step) >= 2; }""", timeout=30_000)
    mid = page.locator(".nl-run").get_attribute("data-status")
    mid_step = int(page.locator('.nl-run .nl-rank[data-rank="0"] .nl-progress').get_attribute("data-step"))
    screenshot(page, "panel-mid-run.png", ".nl-run")
    assert mid == "running" and 2 <= mid_step < 12

    page.wait_for_selector('.nl-run[data-status="finished"]', timeout=90_000)
    screenshot(page, "panel-final.png", ".nl-run")
    for rank in (0, 1):
        assert page.locator(f'.nl-run .nl-rank[data-rank="{rank}"]').get_attribute("data-status") == "finished"
        steps = [text for text in _rank_lines(page, rank) if text.startswith("step ")]
        assert steps == [f"step {i} at batch size 32" for i in range(1, 13)]
        assert "caught the shape mismatch" in _rank_lines(page, rank)
    rows = page.locator(".nl-run .nl-mismatch tbody tr")
    assert rows.count() == 2
    assert [rows.nth(i).get_attribute("data-rank") for i in range(2)] == ["0", "1"]
    assert "[4]" in rows.nth(0).inner_text() and "[2]" in rows.nth(1).inner_text()
    oom = page.locator(".nl-run .nl-oom-row")
    assert oom.count() == 1
    assert (oom.get_attribute("data-batch-size"), oom.get_attribute("data-new-batch-size")) == ("64", "32")
    assert "CUDA out of memory" in oom.inner_text()

    # saved with the notebook: after a reload the panel is drawn again from the saved output
    command(page, "docmanager:save")
    page.reload()
    page.wait_for_selector('.nl-run[data-status="finished"]', timeout=60_000)
    assert [t for t in _rank_lines(page, 1) if t.startswith("step ")] == [f"step {i} at batch size 32"
                                                                         for i in range(1, 13)]
    assert page.locator(".nl-run .nl-mismatch tbody tr").count() == 2
    saved = nbformat.read(str(root / "panel.ipynb"), as_version=4)
    (output,) = [o for o in saved.cells[1].outputs if o.output_type == "display_data"]
    assert output.data["application/vnd.notebook-launcher.run.v1+json"]["status"] == "finished"


def test_the_runs_sidebar_lists_a_run_with_its_live_status(lab):
    page = _start_training(lab, "sidebar.ipynb", steps=10)
    page.wait_for_selector('.nl-run[data-status="running"]', timeout=90_000)
    page.click('.jp-SideBar .lm-TabBar-tab[data-id="notebook-launcher-runs"]')  # the Runs tab
    run = page.locator(".nl-sidebar .nl-sidebar-run")
    page.wait_for_selector('.nl-sidebar .nl-sidebar-run[data-status="running"]', timeout=30_000)
    screenshot(page, "sidebar-running.png")
    assert run.count() == 1
    run_id = page.locator(".nl-run").get_attribute("data-run-id")
    assert run_id in run.inner_text()
    page.wait_for_selector('.nl-sidebar .nl-sidebar-run[data-status="finished"]', timeout=90_000)
    run.click()  # scrolls to the run's output
    page.wait_for_function("""() => { const r = document.querySelector('.nl-run').getBoundingClientRect();
                                      return r.top < window.innerHeight && r.bottom > 0; }""", timeout=10_000)


INSPECT_CELL = '''\
from notebook_launcher import inspect_run
inspector = inspect_run(RUN_ID)
inspector
'''

PAST_RUN_CELL = '''\
from notebook_launcher import notebook_launcher, get_logger, last_run

def chatty():
    import torch.distributed as dist
    rank = dist.get_rank()
    for i in range(300):
        print(f"rank {rank} line {i}")
    get_logger("chatty").error("needle on rank %d", rank, main_process_only=False)

notebook_launcher(chatty, num_processes=2, device="cpu", display="text")
RUN_ID = last_run().run_id
'''


def test_the_inspector_filters_a_past_run_by_text_and_rank(lab):
    root, url, browser = lab
    _notebook(root / "inspect.ipynb", [PAST_RUN_CELL, INSPECT_CELL])
    page = open_notebook(browser, url, "inspect.ipynb")
    command(page, "notebook:run-all-cells", wait=False)
    page.wait_for_selector(".jp-OutputArea-output .widget-vbox input[type=text]", timeout=120_000)
    inspector = page.locator(".jp-OutputArea-output .widget-vbox").first
    header = inspector.inner_text().splitlines()[0]
    assert "finished" in header and "2 ranks" in header and "cpu/gloo" in header, header

    page.locator(".jp-OutputArea-output .widget-vbox input[type=text]").first.fill("needle")
    page.wait_for_function("""() => document.querySelector('.jp-OutputArea-output .widget-vbox').innerText
                                    .includes('needle on rank 1')""", timeout=30_000)
    text = inspector.inner_text()
    assert "needle on rank 0" in text and "line 299" not in text

    inspector.locator("select[multiple]").first.select_option(label="rank 1")  # the rank filter
    page.wait_for_function("""() => !document.querySelector('.jp-OutputArea-output .widget-vbox').innerText
                                     .includes('needle on rank 0')""", timeout=30_000)
    assert "needle on rank 1" in inspector.inner_text()
    screenshot(page, "inspector.png", ".jp-OutputArea-output .widget-vbox")


BALANCE_CELL = '''\
import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from notebook_launcher.rank import balance_meter
from notebook_launcher import notebook_launcher
from notebook_launcher.display import state

balance_meter.INTERVAL_S = state.BALANCE_EVERY_S = 1.0  # figures every second (10 s and 5 s by default)

def train():
    model = DistributedDataParallel(torch.nn.Linear(64, 64))
    held = torch.ones(300 * 2**20 // 4) if dist.get_rank() == 1 else None  # rank 1 holds 300 MB more
    for step in range(100):
        if dist.get_rank() == 1:
            time.sleep(0.06)  # a slower device: the others wait for rank 1 at every step
        model(torch.randn(8, 64)).sum().backward()

notebook_launcher(train, num_processes=3, device="cpu")
'''


def test_the_balance_section_shows_the_straggler_live_and_marks_its_column(lab):
    root, url, browser = lab
    _notebook(root / "balance.ipynb", [BALANCE_CELL])
    page = open_notebook(browser, url, "balance.ipynb")
    command(page, "notebook:run-all-cells", wait=False)

    # live: the section is there while the run goes on, rank 1 marked once the others have waited for it
    page.wait_for_selector('.nl-run[data-status="running"] .nl-balance[data-straggler="1"][data-final="false"]',
                           timeout=90_000)
    assert page.locator(".nl-run").get_attribute("data-status") == "running"
    rows = page.locator(".nl-run .nl-balance-rank")
    assert [rows.nth(i).get_attribute("data-rank") for i in range(3)] == ["0", "1", "2"]
    assert page.locator('.nl-balance-rank[data-straggler="true"]').get_attribute("data-rank") == "1"
    assert page.locator('.nl-run .nl-rank[data-rank="1"][data-straggler="true"] .nl-rank-straggler').is_visible()
    screenshot(page, "balance-live.png", ".nl-run .nl-balance")
    waited = {rank: float(page.locator(f'.nl-balance-rank[data-rank="{rank}"] .nl-balance-wait .nl-balance-fill')
                          .evaluate("node => parseFloat(node.style.width)")) for rank in (0, 1, 2)}
    assert min(waited[0], waited[2]) > waited[1] + 20  # the bars: ranks 0 and 2 wait, rank 1 computes

    page.wait_for_selector('.nl-run[data-status="finished"] .nl-balance[data-final="true"]', timeout=90_000)
    summary = page.locator(".nl-run .nl-balance-summary").inner_text()
    assert summary.startswith("straggler: rank 1 (ranks 0, 2 waited ") and "memory: rank 1 peaked at" in summary
    peaks = page.locator(".nl-run .nl-balance-peak").all_inner_texts()
    assert len(peaks) == 3 and all(text.startswith("peak ") and text.endswith(" MB") for text in peaks)
