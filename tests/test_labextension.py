"""The JupyterLab extension as a user gets it: installed with the package, enabled, and its renderer's own
TypeScript unit tests (vitest, in labextension/test/) passing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

import notebook_launcher

LABEXTENSION = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "labextension")
NAME = "notebook-launcher-panel"


@pytest.mark.processes
def test_the_installed_extension_is_listed_enabled_and_ok():
    listed = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True,
                            text=True, timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
    assert re.search(rf"{NAME} v{re.escape(notebook_launcher.__version__)} enabled OK \(python, notebook.launcher\)",
                     text), text


def test_the_installed_extension_declares_the_renderer_and_the_sidebar():
    folder = os.path.join(sys.prefix, "share", "jupyter", "labextensions", NAME)
    with open(os.path.join(folder, "package.json")) as manifest:
        jupyterlab = json.load(manifest)["jupyterlab"]
    assert jupyterlab["mimeExtension"] and jupyterlab["extension"]
    assert os.path.exists(os.path.join(folder, "static", jupyterlab["_build"]["load"].split("/")[-1]))
    with open(os.path.join(folder, "install.json")) as install:
        assert json.load(install)["packageName"] == "notebook-launcher"


def _node_modules() -> None:
    """The extension's npm packages (Node.js and npm are there: installing from source built the extension)."""
    if not os.path.isdir(os.path.join(LABEXTENSION, "node_modules")):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=LABEXTENSION, check=True,
                       capture_output=True, timeout=600)


@pytest.mark.processes
@pytest.mark.npm
def test_the_renderer_unit_tests_pass():
    _node_modules()
    done = subprocess.run(["npm", "test", "--silent"], cwd=LABEXTENSION, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"Tests\s+\d+ passed", re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)), done.stdout


@pytest.mark.npm
def test_the_typescript_is_formatted_and_lint_clean():
    """prettier and eslint as JupyterLab's extension template sets them up (``npm run lint`` fixes what it can)."""
    _node_modules()
    done = subprocess.run(["npm", "run", "--silent", "lint:check"], cwd=LABEXTENSION, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
