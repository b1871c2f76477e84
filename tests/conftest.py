"""Shared fixtures: small and general on purpose. The fixtures several files use live in helpers/fixtures.py."""

from __future__ import annotations

import os

import pytest
from helpers import costs
from helpers.fixtures import lab, local_sshd, slurm, slurm_cluster  # noqa: F401 - made available to every test

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# tests/xla needs the real torch_xla, in the venv of its own that `make test-xla` builds and runs it in
collect_ignore = [] if os.environ.get("NOTEBOOK_LAUNCHER_TEST_XLA") == "1" else ["xla"]


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


# -- markers by cost (helpers/costs.py): registered, set by fixtures, and checked against what each test starts --
def pytest_configure(config):
    for name, meaning in costs.COSTS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    config.addinivalue_line("markers", f"{costs.FAST}: none of those costs (set by conftest): `make test-fast`")
    costs.install()


@pytest.hookimpl(tryfirst=True)  # before -m selects
def pytest_collection_modifyitems(items):
    costs.mark(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    costs.forget()  # before the test's fixtures are set up: what they start counts as the test's


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if call.when == "call" and report.passed:
        problem = costs.unmarked(item)
        if problem:
            report.outcome, report.longrepr = "failed", problem
