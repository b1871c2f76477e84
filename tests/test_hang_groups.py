"""The hang watch sees async waits and every thread's collectives, and judges a hang per process group.

Real 2-3 rank CPU launches (gloo): a rank blocked in ``work.wait()`` of an async collective is waiting in it; a
background thread's collectives never hide where the main thread waits; a rank that finished is evidence of a
hang only for the collectives of groups it belongs to. Without ``timeout=``: the hang watch alone stops a run.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch
import torch.distributed as dist

from notebook_launcher import LaunchTimeoutError, last_run, notebook_launcher


def notices(run=None):
    return [event.data for event in (run or last_run()).events if event.kind == "hang_notice"]


def async_all_reduce_that_rank_1_skips(how: str, skipper_busy_s: float):
    """Rank 0 launches an all_reduce with async_op=True and waits for it (``how``); rank 1 never calls it: it
    is busy ``skipper_busy_s`` seconds in its own code, then returns."""
    if dist.get_rank() == 1:
        time.sleep(skipper_busy_s)
        return 1
    work = dist.all_reduce(torch.ones(1), async_op=True)
    if how == "wait":
        work.wait()
    elif how == "is_completed":
        while not work.is_completed():
            time.sleep(0.05)
    else:
        work.get_future().wait()
    return 0


@pytest.mark.parametrize("how", ["wait", "is_completed", "get_future"])
@pytest.mark.processes
def test_a_rank_waiting_for_an_async_all_reduce_the_other_skipped_is_stopped_as_hung(how):
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(async_all_reduce_that_rank_1_skips, args=(how, 0), num_processes=2, device="cpu",
                          display="text")
    assert last_run().status == "hung"
    message = str(caught.value)
    assert message.startswith("The ranks stopped making progress: rank 1 had finished its function"), message
    assert re.search(r"rank 0: waiting [\d.]+ s in all_reduce #1 \(async, in its wait\(\)\) at "
                     r".*test_hang_groups\.py:\d+ in async_all_reduce_that_rank_1_skips", message), message


@pytest.mark.processes
def test_a_wait_for_an_async_all_reduce_gets_a_notice_then_the_hang_stop():
    """Rank 1 is busy in its own code while rank 0 waits in work.wait(): a notice names the wait; once rank 1
    has returned, the hang watch stops the run (no timeout= given)."""
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(async_all_reduce_that_rank_1_skips, args=("wait", 8), num_processes=2, device="cpu",
                          hang_warning=2, display="text")
    run = last_run()
    assert run.status == "hung"
    (opened,) = notices(run)  # the stall's notice; rank 1's return is no progress: it is never cleared
    assert opened["state"] == "open" and opened["diverged"] == 1
    assert opened["ranks"]["0"]["state"] == "waiting"
    assert re.fullmatch(r"waiting \d+ s in all_reduce #1 \(async, in its wait\(\)\) at .*test_hang_groups\.py:\d+ "
                        r"in async_all_reduce_that_rank_1_skips", opened["ranks"]["0"]["text"])
    assert opened["ranks"]["1"]["state"] == "busy"
    assert "all_reduce #1 (async, in its wait())" in str(caught.value)


def main_thread_waits_while_background_threads_reduce_alone(skipper_busy_s: float):
    """Every rank has a thread doing all_reduce on a group of its own rank alone, all along; rank 0's main
    thread waits in an all_reduce that rank 1 never calls (rank 1 is busy, then returns)."""
    alone = [dist.new_group([rank]) for rank in range(dist.get_world_size())][dist.get_rank()]
    stop = threading.Event()

    def background():
        while not stop.is_set():
            dist.all_reduce(torch.ones(1), group=alone)
            time.sleep(0.02)

    thread = threading.Thread(target=background)
    thread.start()
    try:
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))  # the main thread's collective #1
        else:
            time.sleep(skipper_busy_s)
    finally:
        stop.set()
        thread.join()


@pytest.mark.processes
def test_a_background_threads_collectives_do_not_hide_the_main_threads_hang():
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(main_thread_waits_while_background_threads_reduce_alone, args=(8,), num_processes=2,
                          device="cpu", hang_warning=2, display="text")
    run = last_run()
    assert run.status == "hung"
    (opened,) = notices(run)  # the background threads' collectives are no progress: the stall is seen
    assert re.fullmatch(r"waiting \d+ s in all_reduce #1 at .*test_hang_groups\.py:\d+ "
                        r"in main_thread_waits_while_background_threads_reduce_alone", opened["ranks"]["0"]["text"])
    assert opened["diverged"] == 1
    message = str(caught.value)
    assert message.startswith("The ranks stopped making progress: rank 1 had finished its function"), message
    assert re.search(r"rank 0: waiting [\d.]+ s in all_reduce #1 at .*test_hang_groups\.py:\d+ "
                     r"in main_thread_waits_while_background_threads_reduce_alone", message), message


def pair_all_reduce_with_rank_1_late(late_s: float):
    """Three ranks: rank 2 returns at once; ranks 0 and 1 all_reduce on their own pair group, rank 1 late."""
    pair = dist.new_group([0, 1])
    if dist.get_rank() == 2:
        return 2
    if dist.get_rank() == 1:
        time.sleep(late_s)
    total = torch.ones(1)
    dist.all_reduce(total, group=pair)
    return int(total.item())


@pytest.mark.processes
def test_a_pair_group_with_a_late_rank_finishes_while_a_rank_outside_it_has_finished():
    assert notebook_launcher(pair_all_reduce_with_rank_1_late, args=(4,), num_processes=3, device="cpu",
                             display="text") == 2
    run = last_run()
    assert run.status == "finished" and run.results == {0: 2, 1: 2, 2: 2}
    assert notices(run) == []


@pytest.mark.processes
def test_with_hang_warning_the_notice_of_a_pair_group_names_its_late_member_and_the_run_finishes():
    assert notebook_launcher(pair_all_reduce_with_rank_1_late, args=(8,), num_processes=3, device="cpu",
                             hang_warning=2, display="text") == 2
    run = last_run()
    assert run.status == "finished"
    opened, cleared = notices(run)
    assert opened["diverged"] == 1  # the pair's other member, not rank 2 (finished, outside the pair)
    assert "rank 1 diverged: the other ranks wait in all_reduce #1; it is in its own code." in opened["text"]
    assert opened["ranks"]["2"]["state"] == "finished"
    assert cleared["state"] == "cleared"


def pair_all_reduce_rank_1_skips():
    """Rank 1 returns without the pair's all_reduce; rank 2, outside the pair, is busy in its own code."""
    pair = dist.new_group([0, 1])
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1), group=pair)
    elif dist.get_rank() == 2:
        time.sleep(60)  # stopped with the run


@pytest.mark.processes
def test_a_hang_inside_a_pair_group_is_stopped_and_blames_only_the_pairs_member():
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(pair_all_reduce_rank_1_skips, num_processes=3, device="cpu", display="text")
    assert last_run().status == "hung"
    headline = str(caught.value).splitlines()[0]
    assert headline == ("The ranks stopped making progress: rank 1 had finished its function (last collective: no "
                        "collective yet), while rank 0 waits in a collective it will never join. The diverging rank "
                        "left the loop early or took another code path.")
    assert re.search(r"^rank 2: is not in any collective", str(caught.value), re.MULTILINE)


def test_a_finished_rank_is_evidence_only_for_the_groups_it_belongs_to(tmp_path):
    """The records as the ranks write them: rank 0's main thread waits on the pair {0, 1} and a thread of its
    waits on the default group; rank 2, outside the pair, finished; the oldest wait is what read() shows."""
    from notebook_launcher.schema.progress_record import ProgressRecord, members_bitmap
    from notebook_launcher.supervision.hangs import HANG_GRACE_S, HangWatch

    watch = HangWatch(str(tmp_path))
    rank_0 = ProgressRecord(watch.path_for(0))
    for rank in (1, 2):
        watch.path_for(rank)
    rank_0.enter("all_reduce", "train.py:9 in main", members=members_bitmap([0, 1]))
    since = watch.read()[0]["since"]
    assert not watch.is_hang({2}, since)
    assert not watch.is_hang({2}, since + HANG_GRACE_S + 1)  # rank 2 would never join: it is not a member
    assert watch.snapshot({0: "running"}, since)[0]["group"] == [0, 1]
    threads_slot = []
    thread = threading.Thread(target=lambda: threads_slot.append(rank_0.enter("barrier", "train.py:30 in beat")))
    thread.start()
    thread.join()
    assert threads_slot == [1]
    places = watch.read_slots()[0]
    assert [(place["operation"], place["inside"]) for place in places] == [("all_reduce", True), ("barrier", True)]
    assert watch.read()[0]["operation"] == "all_reduce"  # the oldest unfinished wait, not the newest
    assert watch.is_hang({2}, since + 10)  # the thread's barrier is on every rank: rank 2 never joins it
    rank_0.leave(slot=threads_slot[0])
    assert not watch.is_hang({2}, since + 20)
    assert not watch.is_hang({1, 2}, since + 20)  # rank 1, a member, is done: the grace counts from now
    assert watch.is_hang({1, 2}, since + 20 + HANG_GRACE_S)
    rank_0.close()
    watch.close()
