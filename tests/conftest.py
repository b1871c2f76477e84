"""Shared fixtures: small and general on purpose."""

from __future__ import annotations

import os

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def runs_dir(tmp_path, monkeypatch):
    """Run logs of every test go to a temp dir (NOTEBOOK_LAUNCHER_RUNS_DIR), never to the user's cache.

    Set in os.environ, so kernels and subprocesses started by the test inherit it too.
    """
    path = tmp_path / "runs"
    monkeypatch.setenv("NOTEBOOK_LAUNCHER_RUNS_DIR", str(path))
    return path


@pytest.fixture
def repo_root() -> str:
    return REPO_ROOT


def run_torchrun(script, *script_args, nproc: int = 2, timeout: float = 120):
    """``torchrun --standalone`` on a script, in a session of its own that is killed whole if it overruns."""
    import signal
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), str(script),
         *map(str, script_args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # torchrun's workers too, whatever happened
        except ProcessLookupError:
            pass
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
