"""The run inspector in a notebook saved and reopened, in a real JupyterLab in Debian's Chromium (Playwright).

ipywidgets' state is not saved with a notebook: reopened, a widget's output is "Error displaying widget: model not
found". The inspector is shown with a static summary of the run just before it; live, the panel is shown and the
summary hidden; saved and reopened in a fresh server and browser, the summary is shown in place of that error.

Screenshots: tests/output/inspector-live.png, tests/output/inspector-reopened.png (and docs/screenshots/ with NOTEBOOK_LAUNCHER_SCREENSHOTS_TO_DOCS=1).
"""

from __future__ import annotations

import os

import nbformat
import pytest
from helpers.browser import (
    _notebook,
    chromium,
    command,
    jupyter_lab,
    open_notebook,
    quiet_settings,
    screenshot,
    to_docs,
)

from notebook_launcher import get_logger, last_run, notebook_launcher

pytestmark = [pytest.mark.slow, pytest.mark.processes, pytest.mark.browser]

OUTPUTS = ".jp-Notebook .jp-CodeCell .jp-OutputArea"
INSPECT_CELL = "from notebook_launcher import inspect_run\ninspect_run({run_id!r})"


def warns(steps):
    """A few prints and warnings on each rank, an error on rank 1."""
    import torch.distributed as dist

    rank = dist.get_rank()
    logger = get_logger("train", log_level="INFO")
    for step in range(1, steps + 1):
        print(f"rank {rank} step {step}")
        if step % 10 == 0:
            logger.warning(f"slow batch at step {step}", main_process_only=False)
    if rank == 1:
        logger.error("could not write the checkpoint", main_process_only=False)


def _visible(page, selector: str) -> bool:
    return page.locator(selector).first.is_visible()


def test_a_reopened_notebook_shows_the_saved_summary_instead_of_model_not_found(tmp_path, runs_dir):
    notebook_launcher(warns, args=(30,), num_processes=2, device="cpu", display="text")
    run_id = last_run().run_id
    root = tmp_path / "lab"
    root.mkdir()
    _notebook(root / "inspect.ipynb", [INSPECT_CELL.format(run_id=run_id)])
    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"),  # where the server keeps which notebooks are trusted
           "JUPYTERLAB_SETTINGS_DIR": quiet_settings(tmp_path / "settings")}

    # live: the panel, and the saved summary hidden
    with jupyter_lab(root, env) as url, chromium(tmp_path / "profile") as browser:
        page = open_notebook(browser, url, "inspect.ipynb")
        command(page, "notebook:run-all-cells")
        page.wait_for_selector(f"{OUTPUTS} .nl-inspector select[multiple]", timeout=120_000)
        levels = page.locator(f"{OUTPUTS} .nl-inspector .widget-dropdown select")
        assert "WARNING and above" in levels.inner_text().replace("\xa0", " ")
        assert "progress rows are hidden" in levels.get_attribute("title")  # what a level means, on hover
        assert "progress rows are hidden" in page.locator(f"{OUTPUTS} .nl-inspector span[title]").first.get_attribute(
            "title")  # and on its label
        kinds = page.locator(f"{OUTPUTS} .nl-inspector select[multiple]").nth(1)  # every kind in sight
        assert int(kinds.get_attribute("size")) == kinds.locator("option").count() >= 5
        assert page.locator(f"{OUTPUTS} .nl-inspector-saved").count() == 1
        assert not _visible(page, f"{OUTPUTS} .nl-inspector-saved")  # the panel says it: told once
        screenshot(page, "inspector-live.png", f"{OUTPUTS}")
        command(page, "docmanager:save")
        page.wait_for_function("""() => !window.jupyterapp.shell.currentWidget.context.model.dirty""",
                               timeout=30_000)
    saved = nbformat.read(str(root / "inspect.ipynb"), as_version=4)
    summary, widget = saved.cells[0].outputs
    assert "nl-inspector-saved" in summary.data["text/html"] and run_id in summary.data["text/plain"]
    assert "application/vnd.jupyter.widget-view+json" in widget.data
    assert "widgets" not in saved.metadata  # the widget's state was not saved: its model is gone when reopened

    # reopened in a fresh server and browser (the kernel that held the panel is gone): the summary
    with jupyter_lab(root, env) as url, chromium(tmp_path / "profile-2") as browser:
        page = open_notebook(browser, url, "inspect.ipynb")
        page.wait_for_selector(f"{OUTPUTS} .nl-inspector-saved", state="visible", timeout=60_000)
        widget_output = f"{OUTPUTS} .jp-OutputArea-child:nth-child(2) .jp-OutputArea-output"
        page.wait_for_function(f"""() => {{ const node = document.querySelector('{widget_output}');
                                          return node && node.textContent.includes('model not found'); }}""",
                               timeout=60_000)  # what ipywidgets says of it: not shown
        text = page.locator(f"{OUTPUTS} .nl-inspector-saved").inner_text()
        assert run_id in text and "finished" in text and f"inspect_run('{run_id}')" in text
        assert "rank" in text and "warnings" in text and "errors" in text
        assert not _visible(page, widget_output)
        assert "model not found" not in page.locator(OUTPUTS).first.inner_text()
        path = screenshot(page, "inspector-reopened.png", f"{OUTPUTS}")
    to_docs(path, "inspector-reopened.png")
