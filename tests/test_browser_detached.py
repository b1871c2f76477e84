"""A detached run in a real JupyterLab, in Debian's Chromium (Playwright): the Runs sidebar lists it with a stop
button; the kernel is restarted, the run goes on, and ``attach()`` in the new kernel makes its panels live again
(the launching cell's too); restarted again and the page reloaded, the same; the sidebar's stop button, once
confirmed, ends the run: every rank and its supervisor gone, the run folder's outcome "interrupted".

The ranks wait for files the test writes (never for a clock): a line they print once the test says so, after
each restart, shows that the panels are live again.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import psutil
import pytest
from helpers.browser import _notebook, command, open_notebook, screenshot

pytestmark = [pytest.mark.slow, pytest.mark.kernel, pytest.mark.processes]
GONE_S = 30

LAUNCH_CELL = '''\
import os, time
from notebook_launcher import notebook_launcher

def train(folder):
    import torch.distributed as dist
    rank = dist.get_rank()
    with open(os.path.join(folder, f".rank{rank}"), "w") as out:
        out.write(str(os.getpid()))
    os.replace(os.path.join(folder, f".rank{rank}"), os.path.join(folder, f"rank{rank}.pid"))
    dist.barrier()
    for word in ("tick", "tock"):
        while not os.path.exists(os.path.join(folder, word)):
            time.sleep(0.05)
        print(f"rank {rank} saw the {word}", flush=True)
    while not os.path.exists(os.path.join(folder, "go")):  # never written: the sidebar's stop ends the run
        time.sleep(0.05)
    return rank

run = notebook_launcher(train, args=(FOLDER,), num_processes=2, device="cpu", detach=True)
print(run.run_id)
'''
ATTACH_CELL = '''\
from notebook_launcher import attach
run = attach()  # the newest detached run; attach(run_id) names one
run
'''
SIDEBAR = ".nl-sidebar .nl-sidebar-run"


def _kernel_idle(page) -> None:
    page.wait_for_function(
        """() => { const w = window.jupyterapp.shell.currentWidget;
                   return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel
                          && w.sessionContext.session.kernel.status === 'idle'; }""", timeout=90_000)


def _run_cell(page, index: int) -> None:
    page.evaluate(f"() => {{ window.jupyterapp.shell.currentWidget.content.activeCellIndex = {index}; }}")
    command(page, "notebook:run-cell", wait=False)


def _show_sidebar(page) -> None:
    if not page.locator(".nl-sidebar").is_visible():
        page.click('.jp-SideBar .lm-TabBar-tab[data-id="notebook-launcher-runs"]')


def _restart_kernel(page) -> None:
    page.evaluate("async () => { await window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                  ".restart(); }")
    _kernel_idle(page)


def _attach_and_see_live(page, run_id: str, folder, word: str) -> None:
    """attach() in the kernel there is now; then a line the ranks print only now reaches both panels of the
    run: the launching cell's and the attaching cell's."""
    _run_cell(page, 1)
    page.wait_for_function(f"""() => document.querySelectorAll('.nl-run[data-run-id="{run_id}"]').length === 2""",
                           timeout=60_000)
    (folder / word).write_text("")
    for index in (0, 1):
        page.wait_for_selector(f'.jp-Cell:nth-child({index + 1}) .nl-run[data-run-id="{run_id}"] '
                               f'.nl-rank[data-rank="0"] .nl-line .nl-text:text("rank 0 saw the {word}")',
                               timeout=60_000)


def _alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
    return alive


def _wait_gone(pids) -> list[int]:
    deadline = time.monotonic() + GONE_S
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _alive(pids)


def test_the_sidebar_stops_a_detached_run_whose_panel_is_live_again_after_a_kernel_restart_and_a_reload(
        lab, tmp_path, runs_dir):
    root, url, browser = lab
    folder = tmp_path / "work"
    folder.mkdir()
    _notebook(root / "detached.ipynb", [f"FOLDER = {str(folder)!r}\n" + LAUNCH_CELL, ATTACH_CELL])
    page = open_notebook(browser, url, "detached.ipynb")
    _run_cell(page, 0)
    page.wait_for_selector('.nl-run[data-status="running"]', timeout=120_000)
    run_id = page.locator(".nl-run").first.get_attribute("data-run-id")
    page.wait_for_selector(f'.jp-RenderedText[data-mime-type="application/vnd.jupyter.stdout"]:has-text("{run_id}")',
                           timeout=60_000)  # the cell's print: it ended, the run goes on
    supervisor = json.loads((runs_dir / run_id / "supervisor.json").read_text())["pid"]
    pids = [supervisor]
    try:
        deadline = time.monotonic() + 60
        while len(list(folder.glob("rank*.pid"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids += [int(path.read_text()) for path in folder.glob("rank*.pid")]
        assert len(pids) == 3 and _alive(pids) == pids

        # the Runs sidebar lists the detached run, with a stop button the launching kernel answers for
        _show_sidebar(page)
        entry = page.locator(f'{SIDEBAR}[data-run-id="{run_id}"]')
        page.wait_for_selector(f'{SIDEBAR}[data-run-id="{run_id}"][data-status="running"] '
                               f'.nl-sidebar-stop[data-stop="enabled"]', timeout=30_000)
        screenshot(page, "sidebar-detached-run.png")

        # the kernel restarts: the run goes on, and attach() makes its panels live again
        _restart_kernel(page)
        assert _alive(pids) == pids, "the run died with its kernel"
        _attach_and_see_live(page, run_id, folder, "tick")

        # restarted again and the page reloaded: no kernel of the page knows the run until attach()
        _restart_kernel(page)
        command(page, "docmanager:save")
        page.reload()
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=60_000)
        page.wait_for_selector(f'.nl-run[data-run-id="{run_id}"]', timeout=60_000)
        _kernel_idle(page)
        assert _alive(pids) == pids, "the run died with its kernel"
        _show_sidebar(page)
        page.wait_for_selector(f'{SIDEBAR}[data-run-id="{run_id}"] .nl-sidebar-stop[data-stop="disabled"]',
                               timeout=30_000)

        _attach_and_see_live(page, run_id, folder, "tock")
        assert entry.count() == 1  # one entry for the run, however many panels show it
        page.wait_for_selector(f'{SIDEBAR}[data-run-id="{run_id}"] .nl-sidebar-stop[data-stop="enabled"]',
                               timeout=30_000)

        # the sidebar's stop, confirmed in JupyterLab's dialog, ends the run
        entry.locator(".nl-sidebar-stop").click()
        page.locator(".jp-Dialog .jp-mod-accept").click()
        page.wait_for_selector(f'{SIDEBAR}[data-run-id="{run_id}"][data-status="interrupted"]', timeout=60_000)
        page.wait_for_function(f"""() => {{ const runs = document.querySelectorAll('.nl-run[data-run-id="{run_id}"]');
                                           return runs.length === 2 && [...runs].every(
                                               r => r.dataset.status === 'interrupted'); }}""", timeout=60_000)
        assert entry.locator(".nl-sidebar-stop").count() == 0
        screenshot(page, "sidebar-detached-stopped.png")
        assert _wait_gone(pids) == [], "processes of the run were left"
        outcome = json.loads((runs_dir / run_id / "outcome.json").read_text())
        assert outcome["status"] == "interrupted", outcome
        assert not os.path.exists(runs_dir / run_id / "supervisor.sock")
    finally:
        for pid in _alive(pids):  # a failed test leaves nothing running: the ranks die with their supervisor
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        assert _wait_gone(pids) == []
