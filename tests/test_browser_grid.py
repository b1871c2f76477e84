"""The live panel at many ranks in a real JupyterLab, in Debian's Chromium (Playwright): the rank grid at 32 ranks
while the run goes on (fed by deltas over the comm), a click opening a rank's lines, a failed rank standing out,
the saved notebook reopening with the final state; at 4 ranks the columns fit the width.

This machine starts at most 8 CPU ranks per core (plan.MAX_RANKS_PER_CORE), so the 32 ranks are a real 16-rank run
recorded first, replayed in the kernel as two hosts of 16 (display/replay.py): the kernel, its comm, the panel
and the browser are the real ones; only the ranks' processes are the recording's.

The grid's screenshot goes to tests/output/grid-32-ranks.png (docs/rank-grid.png is one of these)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import nbformat
import pytest
from helpers.browser import _notebook, command, open_notebook, screenshot

from notebook_launcher.display.budget import SAVED_BYTES

pytestmark = pytest.mark.slow

SETUP = '''\
import os, time
import torch
from notebook_launcher import notebook_launcher, report

def chatty(seconds, fail_rank):
    rank = int(os.environ["RANK"])
    steps = int(seconds * 5)
    for step in range(1, steps + 1):
        for i in range(4):
            print(f"rank {rank} step {step} line {i}", flush=True)
        report(step=step, total=steps, loss=1.0 / step)
        if rank == fail_rank and step == steps - 5:
            raise ValueError(f"rank {rank} gave up at step {step}")
        time.sleep(0.2)
    return rank
'''


RECORD = SETUP + '''
import sys
from notebook_launcher import RankFailedError, last_run
try:
    notebook_launcher(chatty, args=(float(sys.argv[1]), int(sys.argv[2])), num_processes=16, device="cpu",
                      display="text")
except RankFailedError:
    pass
print(last_run().run_dir, file=sys.stderr)
'''


def record_run(seconds: float, fail_rank: int) -> str:
    """A real 16-rank run of ``chatty`` (rank ``fail_rank`` raises near the end); returns its run log folder."""
    done = subprocess.run([sys.executable, "-c", RECORD, str(seconds), str(fail_rank)], capture_output=True,
                          text=True, timeout=180, env=os.environ)
    run_dir = done.stderr.strip().splitlines()[-1]
    assert os.path.exists(os.path.join(run_dir, "events.jsonl")), done.stderr
    return run_dir


@pytest.mark.processes
def test_at_32_ranks_the_grid_shows_live_a_click_opens_lines_a_failure_stands_out_and_it_is_saved(lab):
    root, url, browser = lab
    run_dir = record_run(12, 13)
    replay = f"from notebook_launcher.display.replay import replay\nreplay({run_dir!r}, copies=2)"
    _notebook(root / "grid.ipynb", ["import notebook_launcher", replay])
    frames = []  # what the kernel sends the page: deltas on the comm, display updates

    def on_frame(payload):
        data = payload if isinstance(payload, bytes) else payload.encode()
        frames.append((b'"comm_msg"' in data and b'"delta"' in data, b'"update_display_data"' in data))

    browser.on("page", lambda opened: opened.on("websocket", lambda socket: socket.on("framereceived", on_frame)))
    page = open_notebook(browser, url, "grid.ipynb")
    command(page, "notebook:run-all-cells", wait=False)

    # live: 32 cells in the grid, no columns, lines arriving
    page.wait_for_selector('.nl-run[data-status="running"] .nl-grid .nl-cell[data-rank="31"] .nl-cell-last:not(:empty)',
                           timeout=120_000)
    assert page.locator(".nl-run .nl-grid .nl-cell").count() == 32
    assert page.locator(".nl-run .nl-rank").count() == 0
    page.wait_for_function("""() => { const c = document.querySelector('.nl-cell[data-rank="5"] .nl-cell-step');
                                      return c && Number(c.dataset.step) >= 3; }""", timeout=60_000)
    # a click opens that rank's lines, at once
    answered_ms = page.evaluate("""() => new Promise(resolve => {
        const start = performance.now();
        document.querySelector('.nl-cell[data-rank="5"]').click();
        const check = () => document.querySelector('.nl-grid-column[data-rank="5"] .nl-line')
            ? resolve(performance.now() - start) : requestAnimationFrame(check);
        check(); })""")
    lines = page.locator('.nl-grid-column[data-rank="5"] .nl-line .nl-text').all_inner_texts()
    assert answered_ms <= 200 and lines and all(text.startswith("rank 5 step ") for text in lines), (answered_ms, lines)
    assert page.locator(".nl-run").get_attribute("data-status") == "running"
    step_before = int(page.locator('.nl-cell[data-rank="5"] .nl-cell-step').get_attribute("data-step"))
    page.wait_for_function(f"""() => Number(document.querySelector('.nl-cell[data-rank="5"] .nl-cell-step')
                                            .dataset.step) > {step_before}""", timeout=30_000)  # still live
    screenshot(page, "grid-32-ranks.png", ".nl-run")

    # fed by deltas over the comm; the output itself was updated rarely
    page.wait_for_selector('.nl-run[data-status="failed"]', timeout=120_000)
    deltas = sum(1 for is_delta, _ in frames if is_delta)
    updates = sum(1 for _, is_update in frames if is_update)
    assert deltas >= 4 * 8 and updates <= 12 / 10 + 3, (deltas, updates)

    # the failure: rank 13 (and its copy on the second host, 29) first in its host, marked, coloured unlike the others
    page.wait_for_selector('.nl-run[data-status="failed"]', timeout=120_000)
    for rank in ("13", "29"):
        failed = page.locator(f'.nl-cell[data-rank="{rank}"]')
        assert failed.get_attribute("data-group") == "failed" and failed.get_attribute("data-trouble") == "true"
    hosts = page.evaluate("""() => [...document.querySelectorAll('.nl-grid-host')].map(
        g => [g.dataset.host, g.querySelector('.nl-cell').dataset.rank])""")
    assert hosts == [["node-0", "13"], ["node-1", "29"]]
    colours = dict(page.evaluate("""() => [...document.querySelectorAll('.nl-cell')].map(
        c => [c.dataset.rank, getComputedStyle(c).backgroundColor])"""))
    assert colours["13"] == colours["29"] and all(colour != colours["13"] for rank, colour in colours.items()
                                                  if rank not in ("13", "29"))
    assert page.locator(".nl-run .nl-failure").get_attribute("data-rank") == "13"
    page.click('.nl-grid-filter[data-filter="failed"]')
    visible = page.evaluate("() => [...document.querySelectorAll('.nl-cell')].filter(c => !c.hidden).map(c => c.dataset.rank)")
    assert visible == ["13", "29"]
    screenshot(page, "grid-32-ranks-failed.png", ".nl-run")

    # saved, then reopened: the final state, from the output alone
    command(page, "docmanager:save")
    time.sleep(1)
    saved = nbformat.read(str(root / "grid.ipynb"), as_version=4)
    (output,) = [o for o in saved.cells[1].outputs if o.output_type == "display_data"]
    payload = output.data["application/vnd.notebook-launcher.run.v1+json"]
    assert payload["status"] == "failed" and len(payload["ranks"]) == 32
    assert payload["ranks"][13]["status"] == "failed"
    empty = root / "empty.ipynb"
    _notebook(empty, ["import notebook_launcher", replay])
    assert os.path.getsize(root / "grid.ipynb") - os.path.getsize(empty) <= SAVED_BYTES
    page.reload()
    page.wait_for_selector('.nl-run[data-status="failed"] .nl-grid .nl-cell[data-rank="31"]', timeout=60_000)
    assert page.locator(".nl-run .nl-grid .nl-cell").count() == 32
    assert page.locator('.nl-cell[data-rank="13"]').get_attribute("data-group") == "failed"
    page.click('.nl-grid-filter[data-filter="all"]')
    page.click('.nl-cell[data-rank="13"]')
    texts = page.locator('.nl-grid-column[data-rank="13"] .nl-line .nl-text').all_inner_texts()
    assert any("ValueError: rank 13 gave up" in text for text in texts), texts


def test_at_4_ranks_the_columns_fit_the_width(lab):
    root, url, browser = lab
    _notebook(root / "four.ipynb", [SETUP, 'notebook_launcher(chatty, args=(2, -1), num_processes=4, device="cpu")'])
    page = open_notebook(browser, url, "four.ipynb")
    command(page, "notebook:run-all-cells", wait=False)
    page.wait_for_selector('.nl-run[data-status="finished"] .nl-rank[data-rank="3"] .nl-line', timeout=120_000)
    boxes = page.evaluate("""() => { const grid = document.querySelector('.nl-ranks').getBoundingClientRect();
        return { grid: [grid.left, grid.right], overflow: document.querySelector('.nl-ranks').scrollWidth
                                                          - document.querySelector('.nl-ranks').clientWidth,
                 ranks: [...document.querySelectorAll('.nl-rank')].map(r => { const b = r.getBoundingClientRect();
                                                                          return [b.left, b.right, b.top]; }) }; }""")
    left, right = boxes["grid"]
    assert len(boxes["ranks"]) == 4 and boxes["overflow"] <= 0
    assert all(left - 1 <= a and b <= right + 1 for a, b, _ in boxes["ranks"]), boxes
    assert len({round(top) for _, _, top in boxes["ranks"]}) == 1  # side by side at this width: one row
    assert page.locator(".nl-run .nl-grid").count() == 0
    page.set_viewport_size({"width": 700, "height": 1000})  # narrower: they wrap onto rows, still within
    page.wait_for_function("""() => { const rows = new Set([...document.querySelectorAll('.nl-rank')]
                                      .map(r => Math.round(r.getBoundingClientRect().top))); return rows.size > 1; }""",
                           timeout=10_000)
    overflow = page.evaluate("() => document.querySelector('.nl-ranks').scrollWidth - document.querySelector('.nl-ranks').clientWidth")
    assert overflow <= 0
