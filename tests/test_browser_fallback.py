"""What users of Colab, Kaggle, VS Code, GitHub and nbviewer see: the fallback (``text/html``), in JupyterLab with
the extension disabled for this server only (its own JUPYTER_CONFIG_DIR, ``--level=user``), sampled while a run
goes on; and ``jupyter nbconvert --to html`` of an executed notebook, opened in Chromium.

Screenshots go to tests/output/ (and, with NOTEBOOK_LAUNCHER_SCREENSHOTS_TO_DOCS=1, the README's copies in
docs/screenshots/)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import nbformat
import pytest
from helpers.browser import (
    OUTPUT_DIR,
    chromium,
    command,
    jupyter_lab,
    open_notebook,
    quiet_settings,
    screenshot,
    to_docs,
)
from helpers.cells import hang_cell
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.slow

EXTENSION = "notebook-launcher-panel"
FALLBACK = ".jp-OutputArea-output .nl-run-static"
KERNELSPEC = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}

HANG_CELL = hang_cell(warm_up=5, hang_warning=5, timeout=30)

STEADY_CELL = '''\
import time
import torch.distributed as dist
from notebook_launcher import get_logger, notebook_launcher, report

def train(steps):
    logger = get_logger("train", log_level="INFO")
    for step in range(1, steps + 1):
        if step == 5:
            logger.warning("lr looks high", main_process_only=False)
        print(f"step {step} on rank {dist.get_rank()}, loss {1 / step:.3f}", flush=True)
        report(step=step, total=steps, loss=1 / step)
        time.sleep(0.3)

notebook_launcher(train, args=(60,), num_processes=2, device="cpu")
'''

OOM_CELL = '''\
import torch
import torch.distributed as dist
from notebook_launcher import find_executable_batch_size, notebook_launcher

def train(fail):
    rank = dist.get_rank()

    @find_executable_batch_size(starting_batch_size=64)
    def fit(batch_size):  # rank 1 runs out of memory at 64: every rank restarts at 32
        if rank == 1 and batch_size > 32:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        for step in range(3):
            print(f"step {step} at batch size {batch_size}", flush=True)
        if fail and rank == 1:
            raise ValueError("labels and logits differ in length: 32 != 31")
        return batch_size

    return fit()

try:
    notebook_launcher(train, args=(FAIL,), num_processes=2, device="cpu")
except Exception as error:
    print(type(error).__name__)
'''


def _write(path, cells) -> None:
    nbformat.write(new_notebook(cells=[new_code_cell(source) for source in cells], metadata=KERNELSPEC), str(path))


def _docs_copy(page, name: str) -> str:
    """The fallback's screenshot, in tests/output/ (and docs/screenshots/ when asked: ``to_docs``)."""
    path = screenshot(page, name, FALLBACK)
    to_docs(path, name)
    return path


@pytest.fixture
def lab_without_extension(tmp_path, runs_dir):
    root = tmp_path / "lab"
    root.mkdir()
    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "JUPYTERLAB_SETTINGS_DIR": quiet_settings(tmp_path / "settings")}
    subprocess.run([sys.executable, "-m", "jupyter", "labextension", "disable", "--level=user", EXTENSION],
                   env=env, check=True, capture_output=True, timeout=120)
    with jupyter_lab(root, env) as url, chromium(tmp_path / "profile") as browser:
        yield root, url, browser


def _seconds(page) -> float:
    headline = page.locator(f"{FALLBACK} .nl-verdict > div").nth(1).inner_text()
    return float(re.search(r", ([\d.]+) s", headline)[1])


@pytest.mark.processes
@pytest.mark.browser
def test_the_fallback_of_a_hang_moves_its_clock_and_puts_the_hang_card_first(lab_without_extension):
    root, url, browser = lab_without_extension
    _write(root / "hang.ipynb", [HANG_CELL])
    page = open_notebook(browser, url, "hang.ipynb")
    page.set_viewport_size({"width": 1100, "height": 900})
    command(page, "notebook:run-all-cells", wait=False)
    page.wait_for_selector(f'{FALLBACK} .nl-verdict[data-verdict="hang"]', timeout=90_000)
    assert page.locator(".nl-run").count() == 0  # the extension is off: this is what Colab or VS Code shows
    first = _seconds(page)
    title = page.locator(f"{FALLBACK} .nl-verdict > div").first.inner_text()
    page.wait_for_timeout(5_000)  # no event comes during a hang: only the 2 s tick can move it
    assert _seconds(page) > first
    later = page.locator(f"{FALLBACK} .nl-verdict > div").first.inner_text()
    assert later.startswith("Possible hang: ") and later != title  # its seconds moved too
    assert "rank 0 in all_reduce" in later
    first_child = page.evaluate(f"() => document.querySelector('{FALLBACK}').firstElementChild.className")
    assert first_child == "nl-verdict"
    _docs_copy(page, "fallback-hang.png")
    page.wait_for_selector(f'{FALLBACK} .nl-verdict[data-verdict="timed out"]', timeout=90_000)
    page.wait_for_selector("text=timed out as expected", timeout=60_000)
    assert page.locator(f"{FALLBACK} .nl-verdict > div").first.inner_text().startswith("Timed out after ")
    _docs_copy(page, "fallback-timeout.png")


@pytest.mark.processes
@pytest.mark.browser
def test_the_fallback_of_a_steady_run_has_a_row_per_rank_with_its_step_and_last_line(lab_without_extension):
    root, url, browser = lab_without_extension
    _write(root / "steady.ipynb", [STEADY_CELL])
    page = open_notebook(browser, url, "steady.ipynb")
    page.set_viewport_size({"width": 1100, "height": 900})
    command(page, "notebook:run-all-cells", wait=False)
    page.wait_for_function(f"""() => {{ const node = document.querySelector('{FALLBACK}');
                                        return node && /step (1\\d|[2-5]\\d) on rank 1/.test(node.textContent); }}""",
                           timeout=120_000)
    table = page.locator(f"{FALLBACK} pre").nth(0).inner_text().splitlines()
    assert table[0].split()[:3] == ["rank", "status", "step"]
    for rank, row in enumerate(table[1:3]):
        cells = row.split()
        assert cells[0] == str(rank) and cells[1] == "running" and re.fullmatch(r"\d+/60", cells[2]), row
        assert re.search(rf"step \d+ on rank {rank}, loss", row), row  # its last line
    assert page.locator(f"{FALLBACK} details.nl-rank-lines").count() == 2
    _docs_copy(page, "fallback-steady.png")
    page.wait_for_selector(f'{FALLBACK} .nl-verdict[data-verdict="finished"]', timeout=120_000)


@pytest.mark.processes
@pytest.mark.kernel
@pytest.mark.browser
def test_nbconvert_html_keeps_the_monospace_font_and_the_verdict_card_first(tmp_path, runs_dir):
    from nbclient import NotebookClient

    notebook = new_notebook(cells=[new_code_cell("FAIL = True"), new_code_cell(OOM_CELL),
                                   new_code_cell("FAIL = False"), new_code_cell(OOM_CELL)], metadata=KERNELSPEC)
    NotebookClient(notebook, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    path = tmp_path / "runs.ipynb"
    nbformat.write(notebook, str(path))
    subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", str(path)], check=True,
                   capture_output=True, timeout=120)
    with chromium(tmp_path / "profile") as browser:
        page = browser.new_page()
        page.set_viewport_size({"width": 1000, "height": 900})
        page.goto(f"file://{tmp_path / 'runs.html'}")
        runs = page.locator(".nl-run-static")
        assert runs.count() == 2
        fonts = page.evaluate("() => [...document.querySelectorAll('.nl-run-static pre')]"
                              ".map(pre => getComputedStyle(pre).fontFamily)")
        assert fonts and all("monospace" in font for font in fonts), fonts
        verdicts = page.evaluate("() => [...document.querySelectorAll('.nl-run-static')]"
                                 ".map(run => [run.firstElementChild.className, run.firstElementChild.dataset.verdict])")
        assert verdicts == [["nl-verdict", "failed"], ["nl-verdict", "oom"]]
        aligned = page.evaluate("() => [...document.querySelectorAll('.nl-run-static td, .nl-run-static th')]"
                                ".every(cell => getComputedStyle(cell).textAlign === 'left')")
        assert aligned
        os.makedirs(OUTPUT_DIR, exist_ok=True)
        page.screenshot(path=os.path.join(OUTPUT_DIR, "nbconvert-fallback.png"), full_page=True)
        for index, name in enumerate(("fallback-failure.png", "fallback-oom.png")):
            runs.nth(index).screenshot(path=os.path.join(OUTPUT_DIR, name))
            to_docs(os.path.join(OUTPUT_DIR, name), name)
