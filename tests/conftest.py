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
