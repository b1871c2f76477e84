"""The fixtures several test files use; tests/conftest.py makes them available to every test. (What needs more
than the standard library is imported where it is used: tests/gpu and tests/xla run in leaner environments.)"""

from __future__ import annotations

import os

import pytest

from helpers.slurm_cluster import RESERVATION, SlurmCluster, _left_behind, slurm_missing
from helpers.sshd import LocalSshd

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def local_sshd(tmp_path):
    """A real sshd on 127.0.0.1 and 127.0.0.2 (two "hosts") and a free port, key-based, stopped after the test.
    Yields the ssh options that reach it."""
    sshd = LocalSshd(tmp_path / "sshd")
    try:
        yield sshd.options
    finally:
        sshd.stop()


@pytest.fixture(scope="module")
def slurm_cluster():
    """A real two-node Slurm on loopback (``helpers/slurm_cluster.py``: munged, slurmctld, slurmd n1 and n2, on
    ports of their own), started once for each test module that uses it and stopped by pid at the module's end,
    with a check that none of its daemons is left. (Module scope, not session: its daemons are children of this
    process, and the other modules' tests check that a launch leaves this process no child.) ``SLURM_CONF``
    points at it in os.environ meanwhile. Skips only where the Slurm or munge binaries are absent (``make
    system-deps`` installs them)."""
    missing = slurm_missing()
    if missing:
        pytest.skip(missing)
    cluster = SlurmCluster().start()
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = cluster.conf
    try:
        yield cluster
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        cluster.stop()


@pytest.fixture
def slurm(slurm_cluster, monkeypatch):
    """The cluster, with this process outside any allocation, and afterwards a check that nothing is left:
    squeue empty, no process of ours (an agent, a rank, salloc, srun) alive."""
    for name in [name for name in os.environ if name.startswith(("SLURM_", "SALLOC_", "SRUN_"))]:
        if name != "SLURM_CONF":
            monkeypatch.delenv(name)
    yield slurm_cluster
    try:
        assert slurm_cluster.wait_no_jobs(60) == [], "a Slurm job of the test was left in squeue"
        assert _left_behind(slurm_cluster) == [], "processes of the launch were left behind"
    finally:
        slurm_cluster.run(["scontrol", "delete", f"ReservationName={RESERVATION}"])
        slurm_cluster.cancel_all()


@pytest.fixture
def lab(tmp_path, runs_dir):
    """JupyterLab serving this checkout's built extension (first on its labextensions path) to a kernel that
    imports this checkout's code, and Chromium; yields (root folder, URL, browser)."""
    from helpers.browser import built_extension, chromium, jupyter_lab, quiet_settings

    if built_extension() is None:
        pytest.fail("the extension is not built: cd labextension && npm run build")
    root = tmp_path / "lab"
    root.mkdir()
    python_path = [REPO_ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
           "JUPYTERLAB_SETTINGS_DIR": quiet_settings(tmp_path / "settings"), "PYTHONPATH": os.pathsep.join(python_path)}
    with jupyter_lab(root, env) as url, chromium(tmp_path / "profile") as browser:
        yield root, url, browser
