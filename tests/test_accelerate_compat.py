"""Accelerate's Accelerator, created inside the launched function, is distributed on CPU."""

import os

import pytest

from notebook_launcher import last_run, notebook_launcher

pytestmark = pytest.mark.processes


def with_accelerator():
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    total = accelerator.reduce(torch.tensor([float(accelerator.process_index)]), reduction="sum")
    return {
        "num_processes": accelerator.num_processes,
        "process_index": accelerator.process_index,
        "mixed_precision": accelerator.mixed_precision,
        "distributed_type": str(accelerator.distributed_type),
        "device": accelerator.device.type,
        "wrapped": type(model).__name__,
        "total": total.item(),
    }


def test_accelerator_inside_the_function_sees_two_cpu_processes_and_bf16():
    notebook_launcher(with_accelerator, num_processes=2, mixed_precision="bf16", device="cpu")
    results = last_run().results
    assert sorted(r["process_index"] for r in results.values()) == [0, 1]
    for result in results.values():
        assert result["num_processes"] == 2
        assert result["mixed_precision"] == "bf16"
        assert result["distributed_type"] == "DistributedType.MULTI_CPU"
        assert result["device"] == "cpu"
        assert result["wrapped"] == "DistributedDataParallel"
        assert result["total"] == 1.0
    assert "ACCELERATE_MIXED_PRECISION" not in os.environ


def test_an_accelerator_already_made_in_the_kernel_does_not_block_the_launch():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    Accelerator(cpu=True)  # the common notebook mistake: Accelerate itself refuses to launch after this
    try:
        notebook_launcher(with_accelerator, num_processes=2, device="cpu")
        assert sorted(r["process_index"] for r in last_run().results.values()) == [0, 1]
        assert all(r["num_processes"] == 2 for r in last_run().results.values())
    finally:
        AcceleratorState._reset_state(True)


def with_partial_state():
    import sys

    imported_before = "accelerate" in sys.modules
    from accelerate import PartialState

    state = PartialState()
    return {"num_processes": state.num_processes, "process_index": state.process_index,
            "distributed_type": str(state.distributed_type), "imported_before": imported_before}


def does_not_use_accelerate():
    import sys

    return "accelerate" in sys.modules


def test_a_bare_partial_state_in_a_cpu_worker_sees_the_launch():
    """Accelerate's own launcher leaves a bare PartialState() single-process on CPU; ours does not."""
    notebook_launcher(with_partial_state, num_processes=2, device="cpu")
    results = last_run().results
    assert sorted(r["process_index"] for r in results.values()) == [0, 1]
    for result in results.values():
        assert result["num_processes"] == 2
        assert result["distributed_type"] == "DistributedType.MULTI_CPU"


def test_a_bare_partial_state_in_a_fresh_process_that_never_imported_accelerate(tmp_path):
    """In a kernel that has not imported Accelerate, workers do not import it unless the function does."""
    import subprocess
    import sys

    script = tmp_path / "launch.py"
    script.write_text(
        "import sys\n"
        "from notebook_launcher import notebook_launcher, last_run\n"
        "from tests.test_accelerate_compat import does_not_use_accelerate, with_partial_state\n"
        "assert 'accelerate' not in sys.modules\n"
        "assert notebook_launcher(does_not_use_accelerate, num_processes=2, device='cpu', display='text') is False\n"
        "notebook_launcher(with_partial_state, num_processes=2, device='cpu', display='text')\n"
        "print(sorted((r['num_processes'], r['imported_before']) for r in last_run().results.values()))\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    completed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                               cwd=repo, env={**os.environ, "PYTHONPATH": repo})
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip().splitlines()[-1] == "[(2, False), (2, False)]"


def fails_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("a bad batch on rank 1")
    dist.barrier()


def test_code_written_for_accelerates_launcher_catches_our_failures():
    import pytest
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from notebook_launcher import NotebookLauncherError, RankFailedError

    with pytest.raises(ChildFailedError, match="a bad batch on rank 1") as caught:
        notebook_launcher(fails_on_rank_1, num_processes=2, device="cpu")
    error = caught.value
    assert isinstance(error, RankFailedError) and isinstance(error, NotebookLauncherError)
    assert str(error).startswith("Rank 1 failed first: ValueError: a bad batch on rank 1")
    assert error.get_first_failure()[0] == 1 and error.rank == 1


def test_python_m_notebook_launcher_alone_prints_help_and_exits_0():
    import subprocess
    import sys

    completed = subprocess.run([sys.executable, "-m", "notebook_launcher"], capture_output=True, text=True,
                               timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert "usage: python -m notebook_launcher" in completed.stdout and "doctor" in completed.stdout
    assert "notebook_launcher(train, num_processes=2)" in completed.stdout
