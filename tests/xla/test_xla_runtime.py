"""device="xla" on the real torch_xla, on PJRT's CPU device with two devices (``make test-xla``).

There torch_xla runs one process with a thread per device, the layout of TPU v2/v3's cores; a TPU VM from v4 on
runs a process per chip, which only a TPU shows. Each launch's function follows torch_xla's rule for CPU threads:
the ordinals build the same graphs (per-rank values enter as data, not constants), cut by ``torch_xla.sync()``
before a collective, and staggered, since two threads compiling the same all_reduce at once can be given
different rendezvous ids and abort (XLA's "Termination timeout").
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch_xla  # noqa: E402 - this folder runs in the venv `make test-xla` builds (tests/conftest.py)
from helpers.processes import no_children_left

from notebook_launcher import LaunchArgumentError, LaunchTimeoutError, RankFailedError, last_run, notebook_launcher

pytestmark = pytest.mark.processes

ELEMENTS = 200_000


@pytest.fixture(autouse=True)
def two_cpu_devices(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")


def kernel_runtime_started() -> bool:
    return torch_xla._XLAC._xla_runtime_is_initialized()


def expected(rank: int) -> torch.Tensor:
    return torch.arange(ELEMENTS, dtype=torch.float32) * 0.5 + rank


def reduce_and_return(stagger: float = 1.5):
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    from notebook_launcher import get_logger

    rank = xr.global_ordinal()
    device = torch_xla.device()
    logger = get_logger("xla_test", log_level="INFO")
    logger.info(f"once, from ordinal {rank}")
    logger.info(f"every ordinal: {rank}", main_process_only=False)
    print(f"hello from ordinal {rank} of {xr.world_size()}")
    weights = expected(rank).to(device)
    value = (torch.ones(2) * (rank + 1)).to(device)
    torch_xla.sync()
    time.sleep(stagger * rank)
    total = xm.all_reduce("sum", value)
    torch_xla.sync()
    return {"weights": weights, "total": total, "rank": rank}


def test_every_ordinals_xla_tensors_come_back_on_the_cpu_bit_exact(capsys):
    result = notebook_launcher(reduce_and_return, device="xla", results="all", display="text")
    run = last_run()
    assert result is run.results[0] and set(run.results) == {0, 1} and run.num_processes == 2
    for rank in (0, 1):
        got = run.results[rank]
        assert got["rank"] == rank and got["weights"].device.type == "cpu"
        assert torch.equal(got["weights"], expected(rank)), (rank, got["weights"][:4])
        assert got["total"].tolist() == [3.0, 3.0]  # 1 + 2: the all_reduce crossed the devices
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(
        "notebook_launcher: 2 ordinals (PJRT CPU: 2 devices as threads of one process"), out
    for rank in (0, 1):
        assert f"[rank {rank}] hello from ordinal {rank} of 2" in out
        assert f"[rank {rank}] INFO xla_test: every ordinal: {rank}" in out
    assert "once, from ordinal 0" in out and "once, from ordinal 1" not in out  # main_process_only, per thread
    assert not kernel_runtime_started()
    no_children_left()


def fails_on_ordinal_1():
    import torch_xla.runtime as xr

    if xr.global_ordinal() == 1:
        time.sleep(1)
        raise ValueError("bad shard on ordinal 1")
    time.sleep(600)  # ordinal 0 would wait for ever: the launcher stops it


def test_a_failing_ordinal_is_a_rank_failed_error_naming_it_and_the_others_are_stopped():
    with pytest.raises(RankFailedError, match="bad shard on ordinal 1") as caught:
        notebook_launcher(fails_on_ordinal_1, device="xla", display="text")
    run = last_run()
    assert run.status == "failed" and run.root_cause.rank == 1 and caught.value.rank == 1
    assert "ValueError: bad shard on ordinal 1" in run.root_cause.traceback
    assert "fails_on_ordinal_1" in run.root_cause.traceback
    assert "rank 0: stopped by the launcher" in str(caught.value)
    no_children_left()


def sleeps():
    time.sleep(600)


def test_timeout_stops_every_ordinal():
    with pytest.raises(LaunchTimeoutError):
        notebook_launcher(sleeps, device="xla", timeout=15, display="text")
    run = last_run()
    assert run.status == "timed out"
    # every ordinal's thread was asked for its stacks; threads of one process share its stderr (rank 0's)
    assert sum(text.count(" in sleeps") for text in run.stacks.values()) == 2, run.stacks
    no_children_left()


def test_num_processes_is_checked_against_the_devices_before_anything_starts(monkeypatch):
    refused = r"num_processes=3, but PJRT's CPU device has 2 device\(s\) here \(CPU_NUM_DEVICES=2"
    with pytest.raises(LaunchArgumentError, match=refused):
        notebook_launcher(sleeps, num_processes=3, device="xla")
    no_children_left()
    monkeypatch.delenv("CPU_NUM_DEVICES")  # unset: num_processes says how many CPU devices
    notebook_launcher(reduce_and_return, num_processes=2, device="xla", display="text")
    assert last_run().num_processes == 2 and last_run().results[0]["total"].tolist() == [3.0, 3.0]


def returns_an_xla_tensor():
    return torch.ones(3, device=torch_xla.device()) * 7


def test_one_ordinal_runs_in_a_child_so_the_kernel_can_launch_again(monkeypatch):
    monkeypatch.setenv("CPU_NUM_DEVICES", "1")
    result = notebook_launcher(returns_an_xla_tensor, num_processes=1, device="xla", display="text")
    assert result.device.type == "cpu" and result.tolist() == [7.0, 7.0, 7.0]
    assert last_run().num_processes == 1 and not kernel_runtime_started()
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    notebook_launcher(reduce_and_return, device="xla", display="text")
    assert last_run().status == "finished"
    no_children_left()


def test_spawn_sends_the_function_and_its_arguments_with_cloudpickle():
    scale = 3.0
    result = notebook_launcher(lambda: (torch.ones(2, device=torch_xla.device()) * scale).cpu().tolist(),
                               device="xla", start_method="spawn", display="text")
    assert result == [3.0, 3.0] and last_run().start_method == "spawn"
    assert not kernel_runtime_started()
    no_children_left()


def test_after_the_kernel_started_the_runtime_fork_is_refused_and_auto_spawns():
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch, torch_xla
        from notebook_launcher import LaunchArgumentError, notebook_launcher
        torch.ones(1, device=torch_xla.device())  # the kernel starts its XLA runtime
        try:
            notebook_launcher(lambda: 1, device="xla", start_method="fork")
        except LaunchArgumentError as error:
            print("refused:", error)
        print("auto:", notebook_launcher(lambda: 2, device="xla", display="text"))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "refused: start_method='fork' cannot be used: the XLA runtime is already initialized" in done.stdout
    assert "start method spawn: fork is not safe here (the XLA runtime" in done.stdout
    assert "auto: 2" in done.stdout
