"""The live panel in a real JupyterLab (Debian's Chromium, Playwright) for a launch on the test Slurm's two nodes
(``slurm_cluster``): while the job Slurm was asked for pends, the panel says so with the job id and squeue's
reason; then the ranks run on n1 and n2, each column naming its node. Screenshots: tests/output/."""

from __future__ import annotations

import nbformat
import pytest
from helpers.browser import _notebook, command, open_notebook, screenshot
from helpers.slurm_cluster import RESERVATION, hold_the_nodes

pytestmark = pytest.mark.slow

CELL = '''\
import os
import torch
import torch.distributed as dist
from notebook_launcher import notebook_launcher

def where():
    value = torch.ones(1)
    dist.all_reduce(value)
    print(f"on {os.environ['SLURMD_NODENAME']}: sum {value.item():g}")
    return os.environ["SLURMD_NODENAME"]

notebook_launcher(where, num_processes=2, start_hosts_with="srun", slurm_options=["--nodes=2"], device="cpu",
                  timeout=300)
'''


def test_the_panel_shows_the_pending_job_then_ranks_on_two_nodes(slurm, lab):  # noqa: F811
    hold_the_nodes(slurm)
    root, url, browser = lab
    _notebook(root / "slurm.ipynb", [CELL])
    page = open_notebook(browser, url, "slurm.ipynb")
    command(page, "notebook:run-all-cells", wait=False)

    page.wait_for_function("""() => [...document.querySelectorAll('.nl-run .nl-note')]
                                    .some(n => n.textContent.includes('is pending (ReqNodeNotAvail'))""",
                           timeout=180_000)
    note = next(text for text in page.locator(".nl-run .nl-note").all_inner_texts() if "is pending (" in text)
    screenshot(page, "panel-slurm-pending.png", ".nl-run")
    assert note.startswith("Slurm job ") and "scancel" in note
    slurm.run(["scontrol", "delete", f"ReservationName={RESERVATION}"])

    page.wait_for_selector('.nl-run[data-status="finished"]', timeout=180_000)
    screenshot(page, "panel-slurm-finished.png", ".nl-run")
    hosts = {rank: page.locator(f'.nl-run .nl-rank[data-rank="{rank}"]').get_attribute("data-host")
             for rank in range(4)}
    assert hosts == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    for rank in range(4):
        lines = page.locator(f'.nl-run .nl-rank[data-rank="{rank}"] .nl-line .nl-text').all_inner_texts()
        assert f"on {hosts[rank]}: sum 4" in lines
    command(page, "docmanager:save")
    saved = nbformat.read(str(root / "slurm.ipynb"), as_version=4)
    (output,) = [o for o in saved.cells[0].outputs if o.output_type == "display_data"]
    assert output.data["application/vnd.notebook-launcher.run.v1+json"]["status"] == "finished"
