"""Every launch mechanism is one class behind ``launchers.base.Launcher``: the same ``launch`` arguments, the same
result (``LaunchOutcome``, which only the driver writes into the Run), and ``choose_launcher`` picks one per plan,
so a new mechanism is a class and a line."""

from __future__ import annotations

import inspect

import psutil
import pytest

from notebook_launcher import RankFailedError, last_run
from notebook_launcher.display import TextDisplay
from notebook_launcher.launchers import HostSettings, launch
from notebook_launcher.launchers.base import Launcher
from notebook_launcher.launchers.driver import choose_launcher
from notebook_launcher.launchers.hosts import HostsLauncher
from notebook_launcher.launchers.in_kernel import InKernelLauncher
from notebook_launcher.launchers.intake import EventIntake
from notebook_launcher.launchers.local import LocalLauncher
from notebook_launcher.launchers.outcome import LaunchOutcome
from notebook_launcher.launchers.restarts import RestartPolicy
from notebook_launcher.launchers.slurm import SlurmLauncher
from notebook_launcher.plan import make_plan
from notebook_launcher.runs import Run
from notebook_launcher.schema.runlog import RunLog
from notebook_launcher.schema.status import RunStatus, StopReason


def work():
    return 1


def test_every_mechanism_declares_the_launcher_interface_with_its_arguments():
    expected = inspect.signature(Launcher.launch)
    for mechanism in (LocalLauncher, HostsLauncher, SlurmLauncher, InKernelLauncher):
        assert Launcher in mechanism.__mro__  # declared, not just alike
        assert inspect.signature(mechanism.launch) == expected, mechanism


def test_choose_launcher_picks_one_mechanism_per_plan():
    hosts = ["127.0.0.1", "127.0.0.2"]
    across = make_plan(work, in_workers=True, num_processes=1, num_nodes=2, master_addr=hosts[0], device="cpu")
    assert type(choose_launcher(make_plan(work, num_processes=1, device="cpu"), None)) is InKernelLauncher
    assert type(choose_launcher(make_plan(work, num_processes=2, device="cpu"), None)) is LocalLauncher
    assert type(choose_launcher(across, HostSettings(hosts=hosts))) is HostsLauncher
    assert type(choose_launcher(across, HostSettings(hosts=hosts, start_with="srun"))) is SlurmLauncher


def fail_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("bad batch on rank 1")
    return "rank 0's"


@pytest.mark.processes
def test_a_mechanism_returns_how_the_launch_ended_and_writes_nothing_into_the_run(runs_dir):
    """LocalLauncher's real ranks fail: launch() returns the outcome (status, stop reason, failures, the error);
    the Run is as the driver made it until the driver records that outcome."""
    plan = make_plan(fail_on_rank_1, num_processes=2, device="cpu", start_method="fork")
    log = RunLog()
    run = Run(run_id=log.run_id, run_dir=log.path, device="cpu", backend="gloo", start_method="fork",
              num_processes=2, world_size=2)
    shown = TextDisplay(plan.log_line_prefix_template, plan.node_rank, plan.num_processes)
    intake = EventIntake(run, log, shown)
    try:
        outcome = LocalLauncher().launch(plan, shown, intake, RestartPolicy(intake.on_event))
    finally:
        log.close()
    assert isinstance(outcome, LaunchOutcome) and outcome.status == RunStatus.FAILED
    assert outcome.stop_reason == StopReason.FAILURE and sorted(outcome.failures) == [1]
    assert outcome.root_cause.rank == 1 and isinstance(outcome.error, RankFailedError)
    assert str(outcome.error).startswith("Rank 1 failed first: ValueError: bad batch on rank 1")
    assert run.status == RunStatus.STARTING and run.failures == {} and run.root_cause is None
    assert outcome.error.run is None  # the driver gives it its Run
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.processes
def test_the_driver_records_the_outcome_in_the_run_and_raises_its_error(runs_dir):
    with pytest.raises(RankFailedError) as caught:
        launch(make_plan(fail_on_rank_1, num_processes=2, device="cpu", start_method="fork"), display="text")
    run = caught.value.run
    assert run is last_run() and run.status == "failed" and run.attempts == 1
    assert run.root_cause.rank == 1 and sorted(run.failures) == [1] and run.exit_codes[1] == 1
    assert launch(make_plan(work, num_processes=2, device="cpu"), display="text") == 1
    assert last_run().status == "finished" and last_run().failures == {} and last_run().root_cause is None
    assert psutil.Process().children(recursive=True) == []


def test_a_stop_reason_is_the_panels_failure_kind_and_ends_the_run_with_one_status():
    import os
    import re

    from notebook_launcher.schema.status import ENDS_AS, stopped_by

    assert set(ENDS_AS) == set(StopReason) and len(set(ENDS_AS.values())) == len(StopReason)
    assert all(stopped_by(status) == reason for reason, status in ENDS_AS.items())
    assert stopped_by(RunStatus.FINISHED) is None and stopped_by("timed out") == "timeout"  # a run.json's str too
    schema_ts = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "labextension", "src",
                             "schema.ts")
    with open(schema_ts) as source:
        body = re.search(r"export type FailureKind =(.*?);", source.read(), re.S).group(1)
    assert set(re.findall(r"'([^']+)'", body)) == {reason.value for reason in StopReason}
