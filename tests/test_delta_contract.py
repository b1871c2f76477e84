"""The Python↔TypeScript contract of the live panel's messages (labextension/SCHEMA.md, "Live updates"): the
states and deltas the kernel makes (display/state.py, display/delta.py, display/panel.py) are what the
extension's ``applyDelta`` (labextension/src/delta.ts) and live panel rebuild.

The Python side writes them as a fixture, ``labextension/test/fixtures/delta_contract.json``;
``labextension/test/delta_contract.test.ts`` (vitest) applies each delta to the state before it and checks it
gets the kernel's next state, and plays the recorded comm messages through the live panel. A plain ``npm test``
reads the committed fixture; here it is made anew and vitest runs on it ($NL_DELTA_CONTRACT), and the committed
one is checked to be what the Python side makes now. After a change on the Python side, write it again:

    python tests/test_delta_contract.py

Deterministic: a fixed clock and seeded choices, so the fixture only changes when the protocol's output does.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time as real_time
from unittest import mock

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __name__ == "__main__":
    sys.path.insert(0, ROOT)  # this checkout's package, not an installed one

from notebook_launcher.display import panel as panel_module
from notebook_launcher.display import state as state_module
from notebook_launcher.display.comm import PanelChannel
from notebook_launcher.display.delta import DeltaTracker
from notebook_launcher.display.panel import PanelDisplay
from notebook_launcher.display.state import RunState
from notebook_launcher.schema.events import (
    BATCH_SIZE,
    EXIT,
    FAILURE,
    HANG_NOTICE,
    LAUNCHER,
    LOG,
    OOM_RETRY,
    PROGRESS,
    RESTART,
    SHAPE_MISMATCH,
    STATUS,
    STREAM,
    TRIGGER,
    Event,
)
from notebook_launcher.schema.lines import StreamLines
from notebook_launcher.schema.status import RankStatus, RunStatus

LABEXTENSION = os.path.join(ROOT, "labextension")
FIXTURE = os.path.join(LABEXTENSION, "test", "fixtures", "delta_contract.json")
ENV = "NL_DELTA_CONTRACT"  # where delta_contract.test.ts reads the fixture (default: the committed one)
WALL = 1_796_072_400.0  # started_at of every run here


class _Clock:
    """``time`` as state.py and panel.py read it: a clock the scenario moves."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return WALL + self.now - 1000.0

    def __getattr__(self, name):
        return getattr(real_time, name)


@contextlib.contextmanager
def _clock():
    clock = _Clock()
    with mock.patch.object(state_module, "time", clock), mock.patch.object(panel_module, "time", clock):
        yield clock


class _Scenario:
    """A run fed event by event through a ``RunState``; each ``step()`` records the delta and the state after."""

    def __init__(self, name: str, clock: _Clock, ranks: list[int], lines_per_rank: int):
        self.name, self.clock, self.seq = name, clock, 0
        self.state = RunState(f"run-{name}", f"/tmp/runs/run-{name}", "cpu", "gloo", "fork", len(ranks), len(ranks),
                              ranks, lines_per_rank=lines_per_rank)
        self.tracker = DeltaTracker(self.state)
        self.full = {**self.tracker.reset(), "seq": self.tracker.seq}
        self.steps: list[dict] = []

    def event(self, rank: int, kind: str, dt: float = 0.05, **data) -> None:
        self.clock.now += dt
        self.seq += 1
        self.state.observe(Event(rank=rank, seq=self.seq, time=self.clock.now, kind=kind, data=data))

    def line(self, rank: int, text: str, stream: str = "stdout", dt: float = 0.05) -> None:
        self.event(rank, STREAM, dt, stream=stream, text=text)

    def step(self) -> None:
        delta = json.loads(json.dumps(self.tracker.delta()))  # as the wire carries it
        self.steps.append({"delta": delta, "state": {**self.state.to_json(), "seq": delta["seq"]}})

    def to_json(self) -> dict:
        return {"name": self.name, "caps": self.tracker.caps, "full": self.full, "steps": self.steps}


def _story(clock: _Clock) -> dict:
    """Every kind of change a delta carries, in order (lines_per_rank 4, so the caps cut)."""
    s = _Scenario("story", clock, [0, 1], lines_per_rank=4)
    s.event(0, STATUS, state="starting", pid=4100)
    s.event(1, STATUS, state="starting", pid=4101, host="node-1")
    s.state.note("2 processes on cpu (gloo), start method fork: safe here")
    s.step()  # statuses, pid, host, a note
    s.event(0, STATUS, state="running")
    s.event(1, STATUS, state="running")
    s.line(0, "epoch 1 é \"quoted\" <b>not html</b>")
    s.line(1, "a warning on stderr", stream="stderr")
    s.event(0, LOG, level="WARNING", logger="train", message="loss is high")
    s.event(1, LOG, level="INFO", logger=None, message="no logger")
    s.line(0, "", dt=0.0)  # an empty line, at the same time
    s.step()  # lines of every kind; the run is running
    for step in range(1, 4):
        s.event(0, PROGRESS, step=step, total=10, metrics={"loss": 1 / step, "acc": 0.25 * step})
    s.event(1, PROGRESS, step=1, total=None, metrics={"loss": 0.9})
    s.step()  # chart points; the progress made from them
    s.event(0, PROGRESS, step=4, total=20, metrics={"loss": 0.2})  # a new total: progress comes whole
    s.line(1, "train:  45%|####5     | 45/100 [00:01<00:01, 40.20it/s]")  # a tqdm bar: progress with a label
    s.step()
    for i in range(10):
        s.line(0, f"burst {i}", dt=0.01)  # more lines than the receiver keeps: lines_total comes
    s.state.observe(StreamLines(1, s.seq + 1, clock.now, "stdout", [f"flood {i}" for i in range(7)]))
    s.seq += 7
    s.step()
    s.event(-1, HANG_NOTICE, dt=30.0, state="open", quiet_s=30.0, text="possible hang: ...", diverged=1,
            ranks={"0": {"state": "waiting", "text": "waiting 30 s in barrier #1"},
                   "1": {"state": "in_ddp", "text": "in DDP's gradient all_reduce"}},
            stacks={"0": "File \"train.py\", line 3", "1": "File \"train.py\", line 9"})
    s.step()  # badges: waiting, in DDP
    s.event(-1, HANG_NOTICE, state="open", quiet_s=31.0, text="possible hang: still",
            ranks={"0": {"state": "busy", "text": "busy in user code"}})
    s.step()  # a second open notice replaces the live one: busy
    s.event(-1, HANG_NOTICE, state="cleared", quiet_s=32.0, text="progress resumed after 32 s")
    s.step()  # running again
    s.event(2, STATUS, state="starting", pid=4102)  # a rank beyond the plan: order and new
    s.event(0, SHAPE_MISMATCH, operation="torch.distributed.all_gather", shapes=[[4], [2]],
            dtypes=["torch.float32", "torch.float32"], call_sites=["train.py:12", "train.py:12"],
            message="shapes differ")
    s.event(0, OOM_RETRY, ranks=[1], batch_size=64, new_batch_size=32, error="CUDA out of memory.")
    s.event(0, BATCH_SIZE, batch_size=32)
    s.event(1, TRIGGER, call_site="train.py:30 in train")
    s.event(0, LAUNCHER, text="the launcher says")
    s.step()
    s.event(0, RESTART, attempt=2, text="restarting: attempt 2 of 3")  # every rank starting again
    s.step()
    s.state.set_ranks([1, 2])
    s.state.set_ranks([0, 1, 2])  # rank 0 made anew between two deltas: "new" with the same order
    s.line(0, "rank 0 again")
    s.step()
    s.state.set_ranks([1, 2, 3])  # rank 0 goes, rank 3 comes
    for rank in (1, 2, 3):
        s.event(rank, STATUS, state="running")
    s.step()
    s.event(1, FAILURE, type="ValueError", message="bad value", traceback="Traceback ...\nValueError: bad value\n")
    s.event(1, EXIT, exit_code=1)
    s.event(2, EXIT, exit_code=-15, stopped_by_launcher=True)
    s.event(3, EXIT, exit_code=0)
    s.step()  # failed, stopped, finished
    s.state.finish("failed", failure={"kind": "failure", "rank": 1, "type": "ValueError", "traceback": "T",
                                      "message": "rank 1 failed", "stacks": None}, stuck_ranks=[3])
    s.step()  # the end: status, failure, a stuck rank
    return s.to_json()


def _history_cap(clock: _Clock) -> dict:
    """More chart points between two deltas than the receiver keeps (HISTORY_POINTS)."""
    s = _Scenario("history-cap", clock, [0], lines_per_rank=3)
    s.event(0, STATUS, state="running")
    s.event(0, PROGRESS, step=0, total=300, metrics={"loss": 1.0})
    s.step()
    for step in range(1, 231):
        s.event(0, PROGRESS, dt=0.01, step=step, total=300, metrics={"loss": round(1 / (step + 1), 6)})
    s.state.finish("timed out")  # (and a running rank of a run that timed out is stuck)
    s.step()
    return s.to_json()


def _random_run(clock: _Clock, seed: int, end: str) -> dict:
    """Seeded events of every kind, deltas at random moments (bursts longer than a rank keeps)."""
    rng = random.Random(seed)
    ranks = list(range(rng.randint(2, 4)))
    s = _Scenario(f"random-{seed}", clock, ranks, lines_per_rank=rng.choice([3, 6]))
    for _ in range(rng.randint(40, 60)):
        rank = rng.choice(ranks + [len(ranks)])
        kind = rng.choices([STREAM, LOG, PROGRESS, STATUS, EXIT, HANG_NOTICE], weights=[40, 8, 14, 6, 2, 2])[0]
        if kind == STREAM:
            s.line(rank, rng.choice([f"line {s.seq} é", "", "x" * rng.randint(1, 40)]),
                   stream=rng.choice(["stdout", "stderr"]), dt=rng.choice([0.0, 0.013, 0.2]))
        elif kind == LOG:
            s.event(rank, LOG, level=rng.choice(["INFO", "WARNING", "ERROR"]), logger=rng.choice(["train", None]),
                    message=f"log {s.seq}")
        elif kind == PROGRESS:
            s.event(rank, PROGRESS, step=rng.randint(0, 30), total=rng.choice([30, None]),
                    metrics={"loss": round(rng.random(), 4)})
        elif kind == STATUS:
            s.event(rank, STATUS, state=rng.choice(["starting", "running", "finished", "failed"]), pid=100 + rank,
                    host=rng.choice([None, "node-1"]), exit_code=rng.choice([0, 1]))
        elif kind == EXIT:
            s.event(rank, EXIT, exit_code=rng.choice([0, 1]), stopped_by_launcher=rng.random() < 0.5)
        else:
            s.event(-1, HANG_NOTICE, **rng.choice([
                {"state": "open", "quiet_s": 3.0, "text": "possible hang",
                 "ranks": {str(r): {"state": rng.choice(["waiting", "busy", "in_ddp"]), "text": "at x"}
                           for r in ranks}},
                {"state": "cleared", "quiet_s": 4.0, "text": "progress resumed"}]))
        if rng.random() < 0.03:
            s.state.set_ranks(rng.sample(range(6), rng.randint(1, 4)))
            ranks = sorted(s.state.ranks)
        if rng.random() < 0.2:
            s.step()
    s.state.finish(end, stuck_ranks=ranks[:1] if end == "hung" else ())
    s.step()
    return s.to_json()


class _Comm:
    """A kernel comm, recording what ``display/comm.py`` sends as the frontend gets it (data, first buffer)."""

    def __init__(self):
        self.messages: list[dict] = []

    def send(self, data, buffers=None):
        self.messages.append({"data": data, "buffer": bytes(buffers[0]).decode("utf-8") if buffers else None})

    def close(self):
        pass

    def on_msg(self, handler):
        pass

    def on_close(self, handler):
        pass


def _wire(clock: _Clock) -> dict:
    """A run shown by ``PanelDisplay`` to a panel that opened its comm: the messages as sent (packed), and the
    run's last state."""
    ranks = [0, 1, 2]
    state = RunState("run-wire", "/tmp/runs/run-wire", "cpu", "gloo", "fork", 3, 3, ranks)
    channel = PanelChannel()
    panel = PanelDisplay(state, channel=channel)
    seq = 0

    def show(rank, kind, **data):
        nonlocal seq
        seq += 1
        clock.now += 0.07
        panel.show(Event(rank=rank, seq=seq, time=clock.now, kind=kind, data=data))

    for rank in ranks:
        show(rank, STATUS, state="running", pid=200 + rank)
    comm = _Comm()
    channel.on_open(comm, {"content": {"data": {"run_id": "run-wire"}}})
    for i in range(30):
        show(i % 3, STREAM, stream="stdout" if i % 5 else "stderr", text=f"line {i} é \"q\" \\ {{}}")
        if i % 4 == 0:
            show(i % 3, PROGRESS, step=i, total=30, metrics={"loss": round(1 / (i + 1), 6)})
    with contextlib.redirect_stdout(io.StringIO()):  # (outside IPython the final output is printed)
        final = panel.finish("finished")
    return {"name": "wire", "run_id": "run-wire", "messages": comm.messages, "final": final}


def contract() -> dict:
    """The fixture: every scenario, made now."""
    with _clock() as clock:
        scenarios = [_story(clock), _history_cap(clock)]
        scenarios += [_random_run(clock, seed, end)
                      for seed, end in enumerate(["finished", "hung", "interrupted"])]
        wire = _wire(clock)
    return json.loads(json.dumps({
        "about": "Made by tests/test_delta_contract.py (python tests/test_delta_contract.py writes it); do not edit.",
        "version": 1, "scenarios": scenarios, "wire": wire}))


def write(data: dict, path: str) -> None:
    """One delta or state a line: a diff shows which step changed."""
    def dumps(value):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    out = ['{"about":' + dumps(data["about"]) + ',"version":' + dumps(data["version"]) + ',"scenarios":[']
    for i, scenario in enumerate(data["scenarios"]):
        out.append('{"name":' + dumps(scenario["name"]) + ',"caps":' + dumps(scenario["caps"]) + ',"full":'
                   + dumps(scenario["full"]) + ',"steps":[')
        out += [dumps(step) + ("," if j < len(scenario["steps"]) - 1 else "")
                for j, step in enumerate(scenario["steps"])]
        out.append("]}" + ("," if i < len(data["scenarios"]) - 1 else ""))
    wire = data["wire"]
    out.append('],"wire":{"name":' + dumps(wire["name"]) + ',"run_id":' + dumps(wire["run_id"]) + ',"messages":[')
    out += [dumps(message) + ("," if j < len(wire["messages"]) - 1 else "")
            for j, message in enumerate(wire["messages"])]
    out.append('],"final":' + dumps(wire["final"]) + "}}")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        file.write("\n".join(out) + "\n")


def _statuses(data: dict) -> tuple[set, set]:
    """The run and rank statuses in the fixture's states."""
    states = [scenario["full"] for scenario in data["scenarios"]]
    states += [step["state"] for scenario in data["scenarios"] for step in scenario["steps"]]
    states.append(data["wire"]["final"])
    return ({state["status"] for state in states},
            {rank["status"] for state in states for rank in state["ranks"]})


def python_statuses() -> tuple[set, set]:
    """Every run and rank status the Python side can set: its enums (schema/status.py), which every status
    assignment uses."""
    return {status.value for status in RunStatus}, {status.value for status in RankStatus}


# -- the tests ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def made() -> dict:
    return contract()


def test_the_fixture_is_made_the_same_way_twice(made):
    assert contract() == made  # deterministic: else the committed fixture could never be up to date


def test_the_committed_fixture_is_what_the_python_side_makes_now(made):
    with open(FIXTURE, encoding="utf-8") as file:
        committed = json.load(file)
    assert committed == made, f"{FIXTURE} is out of date: run `python tests/test_delta_contract.py`"


def test_the_scenarios_reach_every_status_the_python_side_sets(made):
    run, rank = _statuses(made)
    source_run, source_rank = python_statuses()
    assert source_rank <= rank, f"rank statuses no scenario shows: {source_rank - rank}"
    assert source_run <= run, f"run statuses no scenario shows: {source_run - run}"


def test_every_status_the_fixture_shows_is_one_the_python_side_names(made):
    """(and those are the TypeScript unions' values: tests/test_status_contract.py)"""
    run, rank = _statuses(made)
    source_run, source_rank = python_statuses()
    assert run <= source_run and rank <= source_rank, (run - source_run, rank - source_rank)


@pytest.mark.processes
@pytest.mark.npm
def test_the_typescript_side_rebuilds_every_state_from_the_deltas(made, tmp_path):
    npm = shutil.which("npm")
    if npm is None or not os.path.isdir(os.path.join(LABEXTENSION, "node_modules")):
        pytest.skip("needs npm and labextension/node_modules (npm ci)")
    path = tmp_path / "delta_contract.json"
    write(made, str(path))
    done = subprocess.run([npm, "test", "--silent", "--", "test/delta_contract.test.ts"], check=False,
                          cwd=LABEXTENSION, capture_output=True, text=True, timeout=300,
                          env={**os.environ, ENV: str(path)})
    output = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
    assert done.returncode == 0, output
    assert str(path) in output  # it read this fixture, not the committed one
    steps = sum(len(scenario["steps"]) for scenario in made["scenarios"])
    assert re.search(rf"{steps} deltas", output), output
    assert re.search(r"Tests\s+\d+ passed", output) and not re.search(r"\d+ (failed|skipped)", output), output


if __name__ == "__main__":
    write(contract(), FIXTURE)
    print(f"wrote {os.path.relpath(FIXTURE, ROOT)}")
