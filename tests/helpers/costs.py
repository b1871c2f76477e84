"""Markers by cost: what a test starts, so that ``make test-fast`` can leave out every test that starts anything.

``processes``: forks workers or starts any other process; ``kernel``: a Jupyter kernel; ``sshd``: the local sshd;
``slurm``: the test Slurm; ``browser``: JupyterLab and Chromium; ``npm``: npm/Node.js. A test that uses one of the
fixtures below is marked by it; the others are marked in their file (module-level ``pytestmark`` or a decorator).

The marks are checked, not trusted: an audit hook (``sys.addaudithook``: ``os.fork``, ``os.posix_spawn``,
``subprocess.Popen``) notes what each test's set-up and body start, and a test that starts something its markers
do not name fails, naming the command and the marker to add. Any cost marker covers plain processes."""

from __future__ import annotations

import os
import sys

COSTS = {
    "processes": "forks workers or starts another process (a launch, torchrun, a script, a command)",
    "kernel": "starts a Jupyter kernel",
    "sshd": "starts the local sshd (and ssh's sessions through it)",
    "slurm": "starts the two-node test Slurm (its daemons)",
    "browser": "starts JupyterLab and Chromium",
    "npm": "runs npm (Node.js)",
}
FAST = "fast"  # the marker of every test with none of these costs: `make test-fast` runs `pytest -m fast`
FIXTURE_COSTS = {"lab": "browser", "local_sshd": "sshd", "slurm": "slurm", "slurm_cluster": "slurm"}
SLURM_DAEMONS = {"munged", "slurmctld", "slurmd"}  # Slurm's clients (srun, squeue, ...) alone are plain processes

_started: dict[str, str] = {}  # cost -> the first command of that cost, for the test running now


def cost_of(argv) -> str:
    """Which cost a command is: by its program, and for Python by what it runs."""
    words = [str(word) for word in argv]
    program = os.path.basename(words[0]) if words else ""
    text = " ".join(words)
    if program in SLURM_DAEMONS:
        return "slurm"
    if program == "sshd":
        return "sshd"
    if "ipykernel" in text:
        return "kernel"
    if "playwright" in text or "chromium" in program or program == "jupyter-lab" or " jupyter lab " in f" {text} ":
        return "browser"
    if program in ("npm", "npx", "node"):
        return "npm"
    return "processes"


def _note(event: str, args) -> None:
    if event == "subprocess.Popen":
        argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        cost, command = cost_of(argv), " ".join(map(str, argv))
    elif event == "os.posix_spawn":
        cost, command = cost_of(args[1]), " ".join(map(str, args[1]))
    elif event in ("os.fork", "os.forkpty"):
        cost, command = "processes", event
    else:
        return
    _started.setdefault(cost, command[:200])


def install() -> None:
    sys.addaudithook(_note)  # for the whole session (a hook cannot be removed); it only notes


def mark(items) -> None:
    """Marks each test by the fixtures it uses, then ``fast`` where it has none of the costs."""
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            if name in FIXTURE_COSTS:
                item.add_marker(FIXTURE_COSTS[name])
        if not any(mark.name in COSTS for mark in item.iter_markers()):
            item.add_marker(FAST)


def forget() -> None:
    _started.clear()


def unmarked(item) -> str | None:
    """What the test started that its markers do not name, as a message (None if nothing)."""
    marked = {mark.name for mark in item.iter_markers() if mark.name in COSTS}
    missing = {cost: command for cost, command in _started.items()
               if cost not in marked and not (cost == "processes" and marked)}
    if not missing:
        return None
    return "this test starts what its markers do not say (tests/helpers/costs.py): " + "; ".join(
        f"{command!r} needs @pytest.mark.{cost}" for cost, command in sorted(missing.items()))
