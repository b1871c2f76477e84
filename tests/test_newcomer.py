"""What a newcomer meets first, from a clone: `make lab` serves the notebooks, and a wheel built from this tree
(after the editable install `make demo` made) carries the production build of the extension."""

from __future__ import annotations

import glob
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.processes
@pytest.mark.browser
def test_make_lab_serves_the_notebooks_folder(tmp_path):
    port = free_port()
    args = f"--no-browser --ServerApp.token= --LabApp.workspaces_dir={tmp_path}"
    lab = subprocess.Popen(["make", "-s", "lab", f"LAB_PORT={port}", f"LAB_ARGS={args}"], cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        listing = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and lab.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=5) as response:
                    listing = response.read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert listing is not None, "JupyterLab never answered"
        assert "quickstart.ipynb" in listing  # the notebooks/ folder is its root
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()


@pytest.mark.processes
def test_a_wheel_built_after_the_editable_install_ships_the_production_extension(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), REPO],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = glob.glob(str(tmp_path / "notebook_launcher-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    extension = [name for name in names if "/labextensions/notebook-launcher-panel/" in name]
    assert any(name.endswith("/static/style.js") for name in extension) and any(
        name.endswith("/package.json") for name in extension)
    assert not [name for name in extension if name.endswith(".js.map") or name.endswith("build_log.json")]
