"""Accelerate's Accelerator, created inside the launched function, is distributed on CPU."""

import os


from notebook_launcher import last_run, notebook_launcher


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
