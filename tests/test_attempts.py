"""The pieces between the supervisor and the display, each on its own: the attempts policy (out-of-memory step
down, max_restarts, here and across hosts), the FailureTracker's root cause and the in-order release.

The events are the ones real workers send (their schema, built here); launches with real processes that go
through the same pieces are in test_launch.py, test_memory.py and test_cluster.py."""

import time

import pytest

from notebook_launcher.display.state import RunState
from notebook_launcher.launchers.intake import EventIntake
from notebook_launcher.launchers.restarts import RestartPolicy
from notebook_launcher.plan import make_plan
from notebook_launcher.runs import Run
from notebook_launcher.schema.events import EXIT, FAILURE, LOG, OOM_RETRY, RESTART, STATUS, STREAM, Event
from notebook_launcher.schema.runlog import RunLog
from notebook_launcher.supervision.failure import FailureTracker, root_cause
from notebook_launcher.supervision.ordering import InOrderRelease


class Shown:
    """A display that keeps what it is given."""

    def __init__(self):
        self.events, self.notes = [], []

    def show(self, event):
        self.events.append(event)

    def note(self, text):
        self.notes.append(text)

    def tick(self):
        pass

    def retarget(self, node_rank, ranks):
        pass


def event(rank, kind, seq=1, when=None, **data):
    return Event(rank=rank, seq=seq, time=time.monotonic() if when is None else when, kind=kind, data=data)


def oom(rank, batch_size, new_batch_size, when):
    return event(rank, FAILURE, when=when, type="OutOfMemoryRetry", message="out of memory", traceback="",
                 exit_code=1, oom_retry={"key": "fit", "batch_size": batch_size, "new_batch_size": new_batch_size,
                                         "error": "CUDA out of memory", "ranks": [rank]})


@pytest.fixture
def attempts(runs_dir):
    log = RunLog()
    run = Run(run_id=log.run_id, run_dir=log.path, device="cpu", backend="gloo", start_method="fork",
              num_processes=2, world_size=4)
    shown = Shown()
    events = EventIntake(run, log, shown)
    yield Launch(events, RestartPolicy(events.on_event)), run, shown
    log.close()


def plan(max_restarts=0):
    return make_plan(function=print, num_processes=2, device="cpu", max_restarts=max_restarts)


class Launch:
    """What a launcher holds: the attempts' event intake and their restart policy."""

    def __init__(self, events: EventIntake, policy: RestartPolicy):
        self.events, self.policy = events, policy

    def next_plan(self, *args, **kwargs):
        return self.policy.next_plan(*args, **kwargs)


def failures_of(launch, *events):
    launch.events.begin(range(4))
    for each in events:
        launch.events.on_event(each)
    launch.events.end()
    return launch.events.tracker.failures()


@pytest.mark.parametrize("who", ["all ranks", "every host"])
def test_an_out_of_memory_error_restarts_everyone_at_the_smallest_size_any_rank_proposes(attempts, who):
    policy, run, shown = attempts
    now = time.monotonic()
    failures = failures_of(policy, oom(3, 64, 32, now), oom(1, 64, 16, now + 0.1))
    next_plan = policy.next_plan(plan(), failures, who)
    assert next_plan.batch_sizes == {"fit": 16}
    assert run.oom_retries == [{"key": "fit", "batch_size": 64, "new_batch_size": 16, "error": "CUDA out of memory",
                                "ranks": [1, 3]}]
    restart = [e for e in shown.events if e.kind == RESTART]
    assert [e.data["attempt"] for e in restart] == [2] and restart[0].data["reason"] == "out of memory"
    assert restart[0].data["batch_size"] == 16 and f"restarting {who} at batch size 16" in restart[0].data["text"]
    assert [e.kind for e in run.events[-2:]] == [OOM_RETRY, RESTART]
    # an out-of-memory step down does not use up max_restarts
    assert policy.next_plan(next_plan, failures_of(policy, oom(0, 16, 8, now)), who).batch_sizes == {"fit": 8}


@pytest.mark.parametrize("who", ["all ranks", "every host"])
def test_another_failure_restarts_while_max_restarts_allows_then_gives_up(attempts, who):
    policy, run, shown = attempts
    crash = event(2, FAILURE, type="RuntimeError", message="transient", traceback="", exit_code=1)
    failures = failures_of(policy, crash)
    first = policy.next_plan(plan(max_restarts=1), failures, who)
    assert first is not None and root_cause(failures).rank == 2
    [restart] = [e for e in shown.events if e.kind == RESTART]
    assert restart.data == {"attempt": 2, "reason": "failure", "batch_size": None,
                            "text": f"rank 2 failed (RuntimeError: transient); restarting {who} (1 of max_restarts=1)"}
    assert policy.next_plan(first, failures_of(policy, crash), who) is None  # the one restart is used
    assert run.attempts == 2 and run.root_cause is None  # the policy writes nothing into the Run


def test_single_attempt_and_an_unrepeatable_attempt_never_try_again(attempts, runs_dir):
    policy, run, shown = attempts
    now = time.monotonic()
    assert policy.next_plan(plan(max_restarts=5), failures_of(policy, oom(1, 64, 32, now)), "every host",
                            may_retry=False) is None
    policy.policy.single_attempt = True  # an agent: the launching kernel decides for every host
    assert policy.next_plan(plan(max_restarts=5), failures_of(policy, oom(1, 64, 32, now)), "all ranks") is None
    assert not [e for e in shown.events if e.kind == RESTART]


def test_the_panel_counts_attempts_from_restart_events(attempts):
    policy, run, shown = attempts
    state = RunState(run.run_id, run.run_dir, "cpu", "gloo", "fork", 2, 4, [0, 1, 2, 3])
    policy.events.display = type("Both", (), {"show": lambda self, e: (shown.show(e), state.observe(e)),
                                       "note": shown.note, "tick": shown.tick})()
    crash = event(2, FAILURE, type="RuntimeError", message="transient", traceback="", exit_code=1)
    policy.next_plan(plan(max_restarts=3), failures_of(policy, crash), "every host")
    policy.next_plan(plan(max_restarts=3), failures_of(policy, crash), "every host")
    payload = state.to_json()
    assert payload["attempt"] == 3 and "restarting every host (2 of max_restarts=3)" in payload["notes"][-1]


def test_the_failure_tracker_blames_the_first_real_failure_not_the_peers_that_lost_it():
    tracker = FailureTracker()
    now = time.monotonic()
    tracker.observe(event(0, STATUS, state="running"))
    tracker.observe(event(1, STATUS, state="running"))
    tracker.observe(event(0, FAILURE, when=now, type="RuntimeError", exit_code=1, traceback="",
                          message="[gloo] Connection closed by peer [127.0.0.1]:1234"))
    tracker.observe(event(1, FAILURE, when=now + 0.05, type="ValueError", message="bad batch", traceback="",
                          exit_code=1))
    tracker.observe(event(1, EXIT, exit_code=1, signal=None, stopped_by_launcher=False))
    tracker.observe(event(2, STREAM, when=now + 0.2, stream="stdout", text="last words"))
    tracker.observe(event(2, EXIT, exit_code=-9, signal=9, signal_name="SIGKILL", stopped_by_launcher=False))
    failures = tracker.failures()
    assert failures[0].secondary and not failures[1].secondary and not failures[2].secondary
    assert root_cause(failures).rank == 1  # later in time than rank 0's, but rank 0 only lost its peer
    assert failures[1].exit_code == 1 and failures[2].type == "killed by SIGKILL"
    assert failures[2].time == now + 0.2  # when the rank was last heard from, on the workers' clock


def test_in_order_records_are_shown_in_rank_order_and_other_events_keep_each_ranks_order():
    shown = Shown()
    release = InOrderRelease([0, 1], shown.show)
    for rank in (0, 1):
        release.push(event(rank, STATUS, state="running"))
    release.push(event(1, LOG, message="b1", in_order=1))
    release.push(event(1, STREAM, stream="stdout", text="after b1"))  # held behind rank 1's record
    assert [e.data.get("message") or e.data.get("text") for e in shown.events if e.kind != STATUS] == []
    release.push(event(0, LOG, message="a1", in_order=1))
    assert [e.data.get("message") or e.data.get("text") for e in shown.events if e.kind != STATUS] == [
        "a1", "b1", "after b1"]
    release.push(event(0, LOG, message="a2", in_order=2))
    assert shown.events[-1].data.get("text") == "after b1"  # a2 waits for rank 1's call 2 ...
    release.push(event(1, EXIT, exit_code=0))  # ... until rank 1 exits: an exited rank holds nobody back
    assert [e.data.get("message") for e in shown.events if e.kind == LOG] == ["a1", "b1", "a2"]


def test_a_stalled_rank_holds_the_others_back_only_for_the_bound():
    shown = Shown()
    release = InOrderRelease([0, 1], shown.show, stall_bound_s=0.2)
    for rank in (0, 1):
        release.push(event(rank, STATUS, state="running"))
    release.push(event(0, LOG, message="a1", in_order=1))
    assert not [e for e in shown.events if e.kind == LOG]
    time.sleep(0.3)
    release.release()
    assert [e.data["message"] for e in shown.events if e.kind == LOG] == ["a1"]
