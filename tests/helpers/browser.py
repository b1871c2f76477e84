"""A real JupyterLab server and Debian's Chromium driven by Playwright, for the panel's browser tests.

The server runs on 127.0.0.1 and a free port, with no token, in a temporary root and workspaces folder (so no old
workspace opens another notebook); ``expose_app_in_browser`` lets a test drive it through
``window.jupyterapp.commands``. Everything it started is stopped, and checked gone, at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import nbformat
import psutil
from nbformat.v4 import new_code_cell, new_notebook

from helpers.processes import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
SERVER_START_S = 90
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
REPO_ROOT = os.path.dirname(TESTS)
OUTPUT_DIR = os.path.join(TESTS, "output")


def built_extension() -> str | None:
    """The extension built in this checkout (notebook_launcher/labextension, made by ``pip install -e .`` or
    ``npm run build`` in labextension/), None if it is not built."""
    import notebook_launcher

    built = os.path.join(os.path.dirname(os.path.abspath(notebook_launcher.__file__)), "labextension")
    return built if os.path.exists(os.path.join(built, "package.json")) else None


def this_extension(env: dict) -> tuple[dict, str | None]:
    """``env`` with JUPYTER_PATH naming first the extension built in this checkout, so the server serves the code
    under test rather than an older copy installed in the environment."""
    built = built_extension()
    if built is None:
        return env, None
    share = tempfile.mkdtemp(prefix="nl-jupyter-path-")
    os.makedirs(os.path.join(share, "labextensions"))
    os.symlink(built, os.path.join(share, "labextensions", "notebook-launcher-panel"))
    paths = [share, *filter(None, [env.get("JUPYTER_PATH")])]
    return {**env, "JUPYTER_PATH": os.pathsep.join(paths)}, share


@contextlib.contextmanager
def jupyter_lab(root_dir, env: dict):
    """``jupyter lab`` in its own process group, serving this checkout's extension; yields its base URL."""
    env, share = this_extension(env)
    port = free_port()
    workspaces = os.path.join(str(root_dir), ".workspaces")
    os.makedirs(workspaces, exist_ok=True)
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0", "--IdentityProvider.token=",
               "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={root_dir}",
               f"--LabApp.workspaces_dir={workspaces}", "--LabApp.expose_app_in_browser=True",
               "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    log_path = os.path.join(str(root_dir), "jupyter-lab.log")
    log = open(log_path, "w")
    server = subprocess.Popen(command, cwd=str(root_dir), env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {server.returncode}:\n{open(log_path).read()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as answer:
                    json.load(answer)
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not answer within {SERVER_START_S} s:\n{open(log_path).read()}")
            time.sleep(0.25)
        yield url
    finally:
        family = []
        with contextlib.suppress(psutil.Error):
            family = [psutil.Process(server.pid)] + psutil.Process(server.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)  # the server shuts its kernels down on SIGTERM
        _, alive = psutil.wait_procs(family, timeout=20)
        for process in alive:
            with contextlib.suppress(psutil.Error):
                process.kill()
        psutil.wait_procs(alive, timeout=5)
        log.close()
        if share:
            shutil.rmtree(share, ignore_errors=True)


def _notebook(path, cells) -> None:
    notebook = new_notebook(cells=[new_code_cell(source) for source in cells],
                            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                     "language": "python"}})
    nbformat.write(notebook, str(path))


@contextlib.contextmanager
def chromium(profile_dir):
    """Debian's Chromium with a fresh profile, headless."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000})
        try:
            yield context
        finally:
            context.close()


def open_notebook(context, url: str, name: str):
    """A page with JupyterLab showing one notebook, its kernel idle and ready."""
    page = context.new_page()
    page.goto(f"{url}/lab/tree/{name}?reset")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell", timeout=60_000)
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    page.wait_for_function(
        """() => { const w = window.jupyterapp.shell.currentWidget;
                   return w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel
                          && w.sessionContext.session.kernel.status === 'idle'; }""", timeout=90_000)
    return page


def command(page, name: str, args: dict | None = None, wait: bool = True):
    """Run a JupyterLab command; with ``wait=False`` do not wait for it (to watch a run while it goes on)."""
    script = f"window.jupyterapp.commands.execute({json.dumps(name)}, {json.dumps(args or {})})"
    if wait:
        page.evaluate(f"async () => {{ await {script}; }}")
    else:
        page.evaluate(f"() => {{ {script}; }}")


def screenshot(page, name: str, selector: str | None = None) -> str:
    """The page, or one element of it (scrolled into view), as a PNG under tests/output/."""
    os.makedirs(OUTPUT_DIR, exist_ok=True)
    path = os.path.join(OUTPUT_DIR, name)
    if selector:
        page.locator(selector).first.scroll_into_view_if_needed()
        page.locator(selector).first.screenshot(path=path)
    else:
        page.screenshot(path=path, full_page=False)
    return path


DOCS_SCREENSHOTS = os.path.join(REPO_ROOT, "docs", "screenshots")


DOCS_COLOURS = 128  # text and flat colours: no pixel off by much (fast octree keeps rare colours), a third of the bytes


def to_docs(path: str, name: str) -> None:
    """Copy a screenshot the README shows into docs/screenshots/, only when asked
    (``NOTEBOOK_LAUNCHER_SCREENSHOTS_TO_DOCS=1``): a test run never changes the checkout's tracked files. The copy
    has a palette of ``DOCS_COLOURS`` (Pillow, which matplotlib brings), so the repository stays small."""
    if os.environ.get("NOTEBOOK_LAUNCHER_SCREENSHOTS_TO_DOCS") != "1":
        return
    os.makedirs(DOCS_SCREENSHOTS, exist_ok=True)
    target = os.path.join(DOCS_SCREENSHOTS, name)
    try:
        from PIL import Image
    except ImportError:
        shutil.copyfile(path, target)
        return
    with Image.open(path) as image:
        image.convert("RGB").quantize(colors=DOCS_COLOURS, method=Image.Quantize.FASTOCTREE,
                                      dither=Image.Dither.NONE).save(target, optimize=True)


def quiet_settings(settings_dir) -> str:
    """A user-settings folder where JupyterLab does not ask about news (its popup would cover the page)."""
    folder = os.path.join(str(settings_dir), "@jupyterlab", "apputils-extension")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "notification.jupyterlab-settings"), "w") as out:
        json.dump({"fetchNews": "false"}, out)
    return str(settings_dir)
