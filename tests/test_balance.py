"""Where the time goes: the straggler, each rank's share of waiting, its steps and its peak memory.

Real worker processes and real gloo collectives on CPU; the rules themselves also on figures made by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest
import torch

from notebook_launcher import last_run, notebook_launcher
from notebook_launcher.balance import MIN_RUN_S, MIN_WAIT_S, BalanceBook
from notebook_launcher.rank import balance_meter
from notebook_launcher.schema.events import BALANCE


def _ddp_with_a_slow_rank(slow_rank, steps=25, delay=0.06):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(64, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        if dist.get_rank() == slow_rank:
            time.sleep(delay)  # a slower device
        optimizer.zero_grad()
        model(torch.randn(8, 64)).sum().backward()
        optimizer.step()
    return "trained"


@pytest.mark.processes
def test_ddp_with_a_slower_rank_names_it_the_straggler(capsys):
    assert notebook_launcher(_ddp_with_a_slow_rank, args=(1,), num_processes=2, device="cpu",
                             display="text") == "trained"
    balance = last_run().balance
    assert balance.final and balance.ranks_measured == [0, 1]
    assert balance.straggler == 1
    assert balance.step_wait_share[0] > balance.step_wait_share[1] + 0.5  # rank 0 waited 60 ms of every step
    assert balance.wait_share[0] > 2 * balance.wait_share[1]  # and of the whole function
    assert set(balance.step_time) == {0, 1} and all(0.05 < t < 1.0 for t in balance.step_time.values())
    out = capsys.readouterr().out
    assert "straggler: rank 1 (rank 0 waited " in out and "of its steps' time for it; it waited " in out
    with open(os.path.join(last_run().run_dir, "run.json")) as summary:
        assert json.load(summary)["balance"]["straggler"] == 1


def _all_reduce_loop(slow_rank, iterations=30, delay=0.05):
    import torch.distributed as dist

    value = torch.ones(16)
    for _ in range(iterations):
        if dist.get_rank() == slow_rank:
            time.sleep(delay)
        dist.all_reduce(value)
    return dist.get_rank()


@pytest.mark.processes
def test_a_plain_all_reduce_loop_with_rank_0_slow_on_three_ranks():
    notebook_launcher(_all_reduce_loop, args=(0,), num_processes=3, device="cpu", display="text")
    balance = last_run().balance
    assert balance.straggler == 0
    assert balance.step_time == {}  # no steps known: no report(step=...), no DDP
    assert min(balance.wait_share[1], balance.wait_share[2]) > balance.wait_share[0] + 0.2


def _balanced_steps(iterations=20):
    import torch.distributed as dist

    from notebook_launcher import report

    value = torch.ones(16)
    for step in range(iterations):
        time.sleep(0.03)  # the same work on every rank
        dist.all_reduce(value)
        report(step=step + 1, total=iterations)


@pytest.mark.processes
def test_a_balanced_run_has_no_straggler_and_says_nothing(capsys):
    notebook_launcher(_balanced_steps, num_processes=3, device="cpu", display="text")
    balance = last_run().balance
    assert balance.straggler is None
    assert sorted(balance.wait_share) == [0, 1, 2] and sorted(balance.step_time) == [0, 1, 2]
    assert all(0.02 < t < 0.5 for t in balance.step_time.values())
    assert "straggler" not in capsys.readouterr().out and "straggler" not in balance.summary()


def _uneven_memory():
    import torch.distributed as dist

    held = torch.ones((400 if dist.get_rank() == 1 else 100) * 2**20 // 4)  # 400 MB on rank 1, 100 MB on rank 0
    held.add_(1)  # touched: resident
    dist.barrier()
    return float(held[0])


@pytest.mark.processes
def test_a_rank_holding_four_times_the_memory_is_named(capsys):
    notebook_launcher(_uneven_memory, num_processes=2, device="cpu", display="text")
    balance = last_run().balance
    assert balance.peak_memory[1] > 1.5 * balance.peak_memory[0]
    assert balance.peak_memory[1] - balance.peak_memory[0] > 250 * 2**20
    assert balance.device_memory == {0: None, 1: None}  # CPU: no device total
    out = capsys.readouterr().out
    assert "memory: rank 1 peaked at " in out and "x rank 0 (on mixed GPUs the smallest sets the batch size)" in out


def _long_enough_for_a_live_update():
    import torch.distributed as dist

    for _ in range(12):
        time.sleep(0.1)
        dist.barrier()


@pytest.mark.processes
def test_figures_arrive_while_the_run_goes_on(monkeypatch):
    monkeypatch.setattr(balance_meter, "INTERVAL_S", 0.3)  # the forked workers inherit it
    notebook_launcher(_long_enough_for_a_live_update, num_processes=2, device="cpu", display="text")
    for rank in (0, 1):
        sent = [event.data for event in last_run().events if event.kind == BALANCE and event.rank == rank]
        assert len(sent) >= 3 and [data["final"] for data in sent].count(True) == 1 and sent[-1]["final"]
        assert [data["elapsed"] for data in sent] == sorted(data["elapsed"] for data in sent)


@pytest.mark.processes
def test_a_run_in_the_kernel_itself_has_an_empty_balance():
    assert notebook_launcher(os.getpid, num_processes=1, device="cpu", display="text") == os.getpid()
    balance = last_run().balance
    assert balance.ranks_measured == [] and balance.straggler is None and balance.summary() == ""
    assert psutil.Process().children(recursive=True) == []


# -- the rules, on figures made by hand ---------------------------------------------------------------------------
def _figures(rank_waits: dict, step_waits: dict | None = None, steps: int = 10) -> BalanceBook:
    """Each rank ran ``steps`` steps of 1 s; ``step_waits[rank]``: its wait in each step."""
    book = BalanceBook()
    for rank, share in rank_waits.items():
        waits = (step_waits or {}).get(rank, [share] * steps)
        records, so_far = [[0, 0.0, 0.0]], 0.0
        for step, wait in enumerate(waits, start=1):
            so_far += wait
            records.append([step, float(step), so_far])
        assert book.observe(rank, {"elapsed": float(steps), "waited": so_far, "steps": records,
                                            "step_source": "report", "final": True, "peak_rss": 10**8, "cuda": None})
    return book


def test_the_straggler_rule_needs_a_clear_gap():
    assert _figures({0: 0.05, 1: 0.5, 2: 0.45}).balance().straggler == 0
    assert _figures({0: 0.05, 1: 0.5, 2: 0.15}).balance().straggler is None  # rank 2 barely waits for it
    assert _figures({0: 0.2, 1: 0.25}).balance().straggler is None


def test_the_straggler_must_wait_least_in_most_steps():
    # rank 1 waits far less in total, but only because rank 0 waited long in 4 steps; in the other 6 rank 0
    # waited least: neither is the one the other waits for at every step
    book = _figures({0: 0, 1: 0}, step_waits={0: [0.0] * 6 + [1.0] * 4, 1: [0.1] * 6 + [0.0] * 4})
    balance = book.balance()
    assert balance.step_wait_share[0] > balance.step_wait_share[1] + 0.2
    assert balance.straggler is None
    steady = _figures({0: 0, 1: 0}, step_waits={0: [0.1] * 10, 1: [0.4] * 10}).balance()
    assert steady.straggler == 0 and steady.step_time == {0: 1.0, 1: 1.0}


def _whole_function(elapsed: float, waited: dict) -> BalanceBook:
    """Final figures of a run without steps: each rank ran ``elapsed`` seconds and waited ``waited[rank]``."""
    book = BalanceBook()
    for rank, seconds in waited.items():
        assert book.observe(rank, {"elapsed": elapsed, "waited": seconds, "steps": [], "final": True,
                                   "peak_rss": 10**8, "cuda": None})
    return book


def test_a_run_of_a_few_hundred_milliseconds_names_no_straggler_whatever_the_shares():
    # one all_reduce on a loaded machine: rank 1 scheduled late, rank 0 waited 90% of 0.3 s for it
    short = _whole_function(0.3, {0: 0.27, 1: 0.01}).balance()
    assert short.straggler is None and short.summary() == ""
    assert short.wait_share[0] > short.wait_share[1] + 0.8  # the shares are as measured: only the verdict waits
    # the same shares over ten seconds are evidence
    assert _whole_function(10.0, {0: 9.0, 1: 0.3}).balance().straggler == 1
    # over the whole function the others must wait MIN_WAIT_S longer, not only a larger share
    assert _whole_function(MIN_RUN_S + 0.2, {0: MIN_WAIT_S - 0.1, 1: 0.0}).balance().straggler is None
    assert _whole_function(MIN_RUN_S + 0.2, {0: MIN_WAIT_S + 0.1, 1: 0.0}).balance().straggler == 1
    # steps are evidence of their own (MIN_STEPS), but not in a run shorter than MIN_RUN_S
    book = BalanceBook()
    for rank, wait in ((0, 0.01), (1, 0.08)):
        records = [[step, step * 0.1, step * wait] for step in range(7)]
        book.observe(rank, {"elapsed": 0.7, "waited": 6 * wait, "steps": records, "step_source": "report",
                            "final": True})
    assert book.balance().step_wait_share and book.balance().straggler is None


def _one_all_reduce():
    import torch.distributed as dist

    value = torch.ones(4)
    dist.all_reduce(value)
    return float(value[0])


@pytest.mark.processes
def test_one_all_reduce_on_a_loaded_machine_prints_no_straggler(capsys):
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]  # two busy cores
    try:
        for _ in range(5):
            assert notebook_launcher(_one_all_reduce, num_processes=2, device="cpu", display="text") == 2.0
            balance = last_run().balance
            assert balance.final and balance.ranks_measured == [0, 1]
            assert balance.straggler is None
            assert "straggler" not in capsys.readouterr().out
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(timeout=10)
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.parametrize("data", [
    None, [], {"elapsed": "1"}, {"elapsed": float("nan"), "waited": 0}, {"elapsed": -1, "waited": 0},
    {"elapsed": 1.0, "waited": 0.5, "steps": "x"}, {"elapsed": 1.0, "waited": 0.5, "steps": [[1, "a", 0], [True]]},
    {"elapsed": 1.0, "waited": 2.0, "cuda": {"peak_allocated": "lots"}, "peak_rss": -5},
])
def test_figures_of_any_form_from_a_pipe_never_raise(data):
    book = BalanceBook()
    book.observe(0, data)
    book.observe(1, {"elapsed": 1.0, "waited": 0.1, "steps": [], "final": True})
    balance = book.balance()
    assert set(balance.ranks_measured) <= {0, 1} and all(0 <= share <= 1 for share in balance.wait_share.values())
    balance.summary()
    json.dumps(balance.to_json())


@pytest.mark.processes
def test_the_readmes_example_runs_and_prints_what_the_readme_shows(capsys):
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")) as readme:
        section = readme.read().split("## Why is my run not N times faster?")[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    balance = last_run().balance
    assert balance.straggler == 1 and balance.wait_share[1] < min(balance.wait_share[0], balance.wait_share[2])
    out = capsys.readouterr().out
    assert "straggler: rank 1 (ranks 0, 2 waited " in out and "of their steps' time for it; it waited " in out
    assert "memory: rank 1 peaked at " in out


def test_the_panel_state_carries_the_balance_bounded_in_rate_and_anew_after_a_restart(monkeypatch):
    from notebook_launcher.display import state as panel_state
    from notebook_launcher.schema.events import RESTART, Event

    clock = [1000.0]
    monkeypatch.setattr(panel_state.time, "monotonic", lambda: clock[0])
    state = panel_state.RunState("id", "/tmp/run", "cpu", "gloo", "fork", 2, 2, [0, 1])

    def figures(rank, waited, final=False):
        state.observe(Event(rank, 1, clock[0], BALANCE, {"elapsed": 10.0, "waited": waited, "steps": [],
                                                          "step_source": None, "final": final,
                                                          "peak_rss": 2**28, "cuda": None}))

    figures(0, 6.0)
    figures(1, 0.2)  # within BALANCE_EVERY_S of the first, but a rank the balance does not name yet: named at once
    assert list(state.to_json()["balance"]["ranks"]) == ["0", "1"]
    clock[0] += panel_state.BALANCE_EVERY_S
    figures(1, 0.3)
    balance = state.to_json()["balance"]
    assert balance["straggler"] == 1 and balance["ranks"]["1"]["wait_share"] == 0.03 and not balance["final"]
    assert balance["summary"].startswith("straggler: rank 1 (rank 0 waited 60% of its time for it")
    figures(0, 5.0, final=True)
    assert state.to_json()["balance"]["ranks"]["0"]["wait_share"] == 0.6  # not made anew for one rank's end...
    figures(1, 0.4, final=True)
    balance = state.to_json()["balance"]  # ...but at once when every rank has ended
    assert balance["final"] and balance["ranks"]["0"]["wait_share"] == 0.5
    state.observe(Event(-1, 0, clock[0], RESTART, {"attempt": 2, "reason": "failure", "text": "restarting"}))
    assert state.to_json()["balance"] is None


def test_a_short_runs_final_figures_make_the_panels_balance_once_every_rank_has_sent_them(monkeypatch):
    """A run shorter than the ranks' 10 s interval sends only final figures: the balance is made when the state is
    next read, once, with every rank's, not anew for each rank's arrival (64 ranks: 64 x 64)."""
    from notebook_launcher.display import state as panel_state
    from notebook_launcher.schema.events import Event

    monkeypatch.setattr(panel_state.time, "monotonic", lambda: 1000.0)
    state = panel_state.RunState("id", "/tmp/run", "cpu", "gloo", "fork", 3, 3, [0, 1, 2])
    made = []
    balance_of = state._balance_book.balance
    monkeypatch.setattr(state._balance_book, "balance", lambda: made.append(1) or balance_of())
    for rank in range(3):
        state.observe(Event(rank, 1, 1000.0, BALANCE, {"elapsed": 5.0, "waited": 1.0 + rank, "steps": [],
                                                       "step_source": None, "final": True, "peak_rss": 2**28,
                                                       "cuda": None}))
    balance = state.to_json()["balance"]
    assert len(made) == 1 and balance["final"] and len(balance["ranks"]) == 3
    assert state.to_json()["balance"] == balance and len(made) == 1  # read again: nothing new, not made again


def test_a_ranks_total_wait_counts_the_ddp_steps_not_sampled_at_the_sampled_ones_mean(tmp_path):
    """The meter notes only DDP's sampled steps and the step before each; the rank's total wait (its
    wait_share) counts every step of the model, the unsampled ones at the sampled ones' mean."""
    from notebook_launcher.rank.balance_meter import DDP_STEPS, BalanceMeter
    from notebook_launcher.schema.progress_record import ProgressRecord

    class Watch:  # what the meter reads of a DDP model's watch
        step = 0

    sent = []
    record = ProgressRecord(str(tmp_path / "record"), create=True)
    meter, watch = BalanceMeter(lambda kind, data: sent.append(data), record), Watch()
    for step in (1, 2, 3, 31, 32, 63, 64):  # period 1 at first, then 32: sampled 1-3, 32, 64
        watch.step = step
        meter.step_done(DDP_STEPS, step, owner=watch, ddp_wait=None if step in (31, 63) else 0.01)
    watch.step = 80  # 16 steps since, none noted yet
    meter.send(final=True)
    record.close()
    assert sent[-1]["waited"] == pytest.approx(0.01 * 80)
    assert [row[3] for row in sent[-1]["steps"]] == [0.01, 0.01, 0.01, None, 0.01, None, 0.01]


def _two_ddp_models(steps=12):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    first, second = DistributedDataParallel(torch.nn.Linear(8, 8)), DistributedDataParallel(torch.nn.Linear(8, 8))
    for _ in range(steps):
        if dist.get_rank() == 0:
            time.sleep(0.03)
        first(torch.randn(4, 8)).sum().backward()
        second(torch.randn(4, 8)).sum().backward()  # a GAN's second model: the same step, not another


@pytest.mark.processes
def test_with_two_ddp_models_the_first_ones_backward_ends_each_step():
    notebook_launcher(_two_ddp_models, num_processes=2, device="cpu", display="text")
    balance = last_run().balance
    steps = [record[0] for record in last_run().balance_book.ranks[1]["steps"]]
    assert steps == list(range(1, 13))
    assert all(t > 0.025 for t in balance.step_time.values())  # a whole step each, not half of one
    assert balance.straggler == 0
