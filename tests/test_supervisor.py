"""The supervisor of one attempt, through its own API: real workers, the result value run() returns."""

import dataclasses
import datetime
import os
import signal
import time

import psutil
import pytest
import torch
import torch.distributed  # noqa: F401 - imported once here, not in every forked worker (as the launcher does)
from helpers.processes import no_children_left

from notebook_launcher.cluster.ports import reserve_port
from notebook_launcher.launchers.payload import spawn_payload
from notebook_launcher.plan import make_plan
from notebook_launcher.schema.events import EXIT, FAILURE, RESULT, STATUS, STREAM
from notebook_launcher.schema.lines import expand_lines
from notebook_launcher.schema.results import unpack_result
from notebook_launcher.supervision.supervisor import Supervisor

pytestmark = pytest.mark.processes


def supervise(function, args=(), start_method="fork", timeout=None, progress_dir="", tmp_path=None,
              on_event=None, on_tick=None):
    """One attempt as the launcher runs it: a plan, a reserved port whose socket rank 0 serves on, every event
    kept. Returns (outcome, events)."""
    plan = make_plan(function=function, args=args, num_processes=2, start_method=start_method, device="cpu",
                     timeout=timeout)
    reservation = reserve_port(plan.master_addr, 0)
    plan = dataclasses.replace(plan, master_port=reservation.port)
    payload_path = ""
    if start_method == "spawn":
        payload_path = str(tmp_path / "payload.pkl")
        with open(payload_path, "wb") as out:
            out.write(spawn_payload(function, plan.args))
    events = []

    def keep(event):  # (a run of lines comes whole: kept as its lines, one Event each)
        for line in expand_lines((event,)):
            events.append(line)
            if on_event is not None:
                on_event(line)

    supervisor = Supervisor(plan, keep, payload_path, on_tick=on_tick, store_listen_fd=reservation.fileno(),
                            progress_dir=progress_dir)
    try:
        return supervisor.run(plan.timeout, on_started=reservation.close), events
    finally:
        reservation.close()


def stderr_after(events, rank, seq):
    return "\n".join(e.data["text"] for e in events if e.rank == rank and e.kind == STREAM and e.seq > seq
                     and e.data["stream"] == "stderr")


def rank_plus_one():
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    print(f"rank {dist.get_rank()} sees {value.item()}")
    return dist.get_rank() * 10


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_clean_run_has_no_stop_reason_and_every_rank_exited_0(start_method, tmp_path):
    outcome, events = supervise(rank_plus_one, start_method=start_method, tmp_path=tmp_path)
    assert outcome.stop_reason is None
    assert outcome.ranks == [0, 1]
    assert outcome.exit_codes == {0: 0, 1: 0}
    assert outcome.snapshot == {} and outcome.stack_dump_seq == {}
    results = {e.rank: unpack_result(e.data, e.attachment) for e in events if e.kind == RESULT}
    assert results == {0: 0, 1: 10}
    for rank in (0, 1):
        assert f"rank {rank} sees 3.0" in [e.data["text"] for e in events if e.rank == rank and e.kind == STREAM]
        exits = [e for e in events if e.rank == rank and e.kind == EXIT]
        assert len(exits) == 1 and exits[0] is [e for e in events if e.rank == rank][-1]  # its last event
        assert [e.seq for e in events if e.rank == rank] == sorted(e.seq for e in events if e.rank == rank)
    no_children_left()


def raise_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(0.2)  # rank 0 is already blocked in all_reduce
        raise ValueError("bad batch on rank 1")
    dist.all_reduce(torch.ones(1))
    time.sleep(30)


def test_a_raising_rank_stops_the_run_with_failure():
    started = time.monotonic()
    outcome, events = supervise(raise_on_rank_1)
    assert time.monotonic() - started < 20  # not rank 0's 30 s sleep
    assert outcome.stop_reason == "failure"
    assert outcome.ranks == [0, 1]
    failures = [e for e in events if e.kind == FAILURE]
    assert failures[0].rank == 1 and failures[0].data["type"] == "ValueError"
    assert outcome.exit_codes[1] != 0 and outcome.exit_codes[0] is not None  # every rank reaped
    assert outcome.snapshot == {}
    no_children_left()


def finish_early_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins: it has returned
        time.sleep(60)
    return "left"


def test_a_rank_waiting_for_a_finished_rank_is_a_hang_with_where_each_rank_was(tmp_path):
    outcome, events = supervise(finish_early_on_rank_1, progress_dir=str(tmp_path))
    assert outcome.stop_reason == "hang"
    assert outcome.snapshot[1]["state"] == "finished"
    assert outcome.snapshot[0]["state"] == "running"
    assert outcome.snapshot[0]["inside"] and outcome.snapshot[0]["operation"] == "all_reduce"
    assert "test_supervisor.py" in outcome.snapshot[0]["call_site"]
    assert 0 in outcome.stack_dump_seq  # the live rank was asked for its stacks, which came after that seq
    assert "in finish_early_on_rank_1" in stderr_after(events, 0, outcome.stack_dump_seq[0])
    no_children_left()


def stuck_in_barrier_and_in_sleep():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.barrier()  # rank 1 never joins
    else:
        time.sleep(60)


def test_the_timeout_stops_the_run_with_every_rank_place_and_stacks(tmp_path):
    started = time.monotonic()
    outcome, events = supervise(stuck_in_barrier_and_in_sleep, timeout=2, progress_dir=str(tmp_path))
    assert time.monotonic() - started < 15
    assert outcome.stop_reason == "timeout"
    assert {rank: info["state"] for rank, info in outcome.snapshot.items()} == {0: "running", 1: "running"}
    assert outcome.snapshot[0]["inside"] and outcome.snapshot[0]["operation"] == "barrier"
    assert not outcome.snapshot[1]["inside"]
    assert sorted(outcome.stack_dump_seq) == [0, 1]
    for rank in (0, 1):
        assert "in stuck_in_barrier_and_in_sleep" in stderr_after(events, rank, outcome.stack_dump_seq[rank])
    no_children_left()


def sleep_after_barrier():
    import torch.distributed as dist

    dist.barrier()
    print("started", flush=True)
    time.sleep(60)


def test_an_interrupt_is_raised_once_every_worker_is_gone_and_the_handler_is_back():
    handler_before = signal.getsignal(signal.SIGINT)
    fds_before = psutil.Process().num_fds()
    started = []

    def interrupt_once_started(event):
        if event.kind == STREAM and event.data["text"] == "started" and not started:
            started.append(event.rank)
            os.kill(os.getpid(), signal.SIGINT)  # what Jupyter's interrupt does to the kernel

    with pytest.raises(KeyboardInterrupt):
        supervise(sleep_after_barrier, on_event=interrupt_once_started)
    assert started
    assert signal.getsignal(signal.SIGINT) is handler_before
    assert psutil.Process().num_fds() == fds_before
    no_children_left()


def test_an_error_in_the_event_handler_still_ends_every_worker_and_closes_every_fd():
    fds_before = psutil.Process().num_fds()

    broken = []

    def broken_display(event):  # once broken, it stays broken: the teardown's events fail too
        if broken or event.kind == STREAM:
            broken.append(event)
            raise RuntimeError("the display broke")

    with pytest.raises(RuntimeError, match="the display broke"):
        supervise(sleep_after_barrier, on_event=broken_display)
    assert psutil.Process().num_fds() == fds_before
    no_children_left()


def rank_0_returns_last(stamp_path: str, delay: float):
    import torch.distributed as dist

    if dist.get_rank() == 0:
        time.sleep(delay)
        with open(stamp_path, "w") as stamp:
            stamp.write(repr(time.monotonic()))
    return dist.get_rank()


def test_a_rank_that_returned_waits_without_spinning_and_leaves_only_once_every_rank_has_returned(tmp_path):
    stamp, pids, finished_at, exited_at, cpu = tmp_path / "rank0-returned", {}, {}, {}, []

    def on_event(event):
        if event.kind == STATUS and "pid" in event.data:
            pids[event.rank] = event.data["pid"]
        if event.kind == STATUS and event.data.get("state") == "finished":
            finished_at[event.rank] = time.monotonic()
        if event.kind == EXIT:
            exited_at[event.rank] = time.monotonic()

    def on_tick():  # rank 1's CPU time, from a while after it finished until rank 0 returns
        if 1 in finished_at and time.monotonic() - finished_at[1] > 0.3 and not stamp.exists():
            times = psutil.Process(pids[1]).cpu_times()
            cpu.append(times.user + times.system)

    outcome, events = supervise(rank_0_returns_last, args=(str(stamp), 2.0), on_event=on_event, on_tick=on_tick)
    assert outcome.stop_reason is None and outcome.exit_codes == {0: 0, 1: 0}
    assert exited_at[1] >= float(stamp.read_text()), "rank 1 left before rank 0 had returned"
    # waiting on the store's key, not asking it every few milliseconds: about nothing over more than a second
    assert len(cpu) >= 2 and cpu[-1] - cpu[0] < 0.02, cpu
    no_children_left()


def test_a_rank_waits_again_when_its_wait_for_the_others_times_out(tmp_path, monkeypatch):
    from notebook_launcher.rank import leaving

    monkeypatch.setattr(leaving, "_WAIT_EACH", datetime.timedelta(milliseconds=200))  # (forked: the ranks have it)
    stamp, exited_at = tmp_path / "rank0-returned", {}

    def on_event(event):
        if event.kind == EXIT:
            exited_at[event.rank] = time.monotonic()

    outcome, events = supervise(rank_0_returns_last, args=(str(stamp), 1.5), on_event=on_event)
    assert outcome.stop_reason is None and outcome.exit_codes == {0: 0, 1: 0}
    assert exited_at[1] >= float(stamp.read_text())  # 7 timeouts later, still waiting
    assert sorted(unpack_result(e.data, e.attachment) for e in events if e.kind == RESULT) == [0, 1]
    no_children_left()
