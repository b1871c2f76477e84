"""Out-of-memory retries with real allocations under real memory caps."""

import os
import subprocess
import sys
import textwrap

import psutil
import pytest
import torch

from notebook_launcher import (
    LaunchArgumentError,
    RankFailedError,
    find_executable_batch_size,
    free_memory,
    last_run,
    notebook_launcher,
    release_memory,
    should_reduce_batch_size,
)
from notebook_launcher.rank.memory import memory_figures

MB = 2**20


def _address_space_with_accelerate():
    from accelerate import Accelerator

    Accelerator()
    return memory_figures()["virtual_bytes"]


def worker_address_space() -> int:
    """A launched worker's address space with Accelerate set up, before it allocates (the base for memory_limit)."""
    return notebook_launcher(_address_space_with_accelerate, num_processes=2, device="cpu")


@pytest.mark.processes
def test_one_process_under_a_cap_tries_128_64_32_and_succeeds_at_32(tmp_path):
    """In one process (as in the kernel), with an address-space cap where 4 MB x 32 fits and x 64 does not."""
    script = tmp_path / "one_process.py"
    script.write_text(textwrap.dedent("""
        import resource, torch
        from notebook_launcher import find_executable_batch_size
        from notebook_launcher.rank.memory import memory_figures

        base = memory_figures()["virtual_bytes"]
        resource.setrlimit(resource.RLIMIT_AS, (base + 200 * 2**20, resource.RLIM_INFINITY))
        tried = []

        @find_executable_batch_size(starting_batch_size=128)
        def train(batch_size):
            tried.append(batch_size)
            activations = torch.ones(batch_size, 2**20)  # 4 MB per sample
            return batch_size, float(activations.sum())

        print("result", train(), "tried", tried)
    """))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # OpenMP's thread stacks would count against the cap too
    completed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert completed.returncode == 0, completed.stderr
    assert "result (32, 33554432.0) tried [128, 64, 32]" in completed.stdout
    assert "out of memory at batch size 128 (RuntimeError:" in completed.stderr
    assert "DefaultCPUAllocator: can't allocate memory" in completed.stderr


def guide_shaped_training(memory_per_sample_on_rank_1):
    """The troubleshooting guide's shape: an accelerator made outside, `nonlocal`, free_memory(), and the model,
    optimizer and dataloader built inside the decorated function."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    accelerator = Accelerator()
    sizes_seen = []

    @find_executable_batch_size(starting_batch_size=128)
    def inner_training_loop(batch_size):
        nonlocal accelerator
        accelerator.free_memory()
        sizes_seen.append(batch_size)
        model = torch.nn.Linear(16, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(TensorDataset(torch.randn(256, 16), torch.randn(256, 1)), batch_size=batch_size)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for inputs, targets in loader:
            if accelerator.process_index == 1:  # rank 1's inputs come with big extra features
                torch.ones(batch_size, memory_per_sample_on_rank_1 // 4).sum()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        return batch_size

    return {"batch_size": inner_training_loop(), "sizes_seen": sizes_seen}


@pytest.mark.processes
def test_two_ranks_where_only_rank_1_runs_out_retry_together_and_finish(capsys):
    base = worker_address_space()
    result = notebook_launcher(guide_shaped_training, args=(8 * MB,), num_processes=2, device="cpu",
                               memory_limit=base + 400 * MB, timeout=120)  # 32 x 8 MB fits, 64 x 8 MB does not
    run = last_run()
    assert result == {"batch_size": 32, "sizes_seen": [32]}  # restarted ranks start from the agreed size
    assert [run.results[rank]["batch_size"] for rank in (0, 1)] == [32, 32]
    assert [(r["batch_size"], r["new_batch_size"], r["ranks"]) for r in run.oom_retries] == [(128, 64, [1]),
                                                                                             (64, 32, [1])]
    assert all("can't allocate memory" in r["error"] and r["memory"]["virtual_bytes"] > 0 for r in run.oom_retries)
    out = capsys.readouterr().out
    assert "rank 1 ran out of memory at batch size 128 (RuntimeError: " in out
    assert "restarting all ranks at batch size 64" in out and "finished at batch size 32" in out
    assert psutil.Process().children(recursive=True) == []


def test_reaching_zero_is_a_clear_error_listing_the_sizes_tried():
    @find_executable_batch_size(starting_batch_size=4)
    def never_fits(batch_size):
        return torch.empty(batch_size, 2**40, dtype=torch.uint8)  # a terabyte per sample: a real allocator error

    with pytest.raises(RuntimeError, match=r"No executable batch size found, reached zero. Tried: \[4, 2, 1\]"):
        never_fits()


@pytest.mark.processes
def test_reaching_zero_in_a_launched_run_ends_it_with_that_error():
    def never_fits():
        @find_executable_batch_size(starting_batch_size=2)
        def inner(batch_size):
            return torch.empty(batch_size, 2**40, dtype=torch.uint8)

        return inner()

    with pytest.raises(RankFailedError, match="No executable batch size found, reached zero"):
        notebook_launcher(never_fits, num_processes=2, device="cpu", timeout=60)
    assert [r["new_batch_size"] for r in last_run().oom_retries] == [1]


def test_other_errors_pass_through_untouched_and_each_call_starts_again():
    calls = []
    error = ValueError("bad data")

    @find_executable_batch_size(starting_batch_size=8)
    def fails(batch_size):
        calls.append(batch_size)
        raise error

    with pytest.raises(ValueError) as caught:
        fails()
    assert caught.value is error and calls == [8]
    with pytest.raises(ValueError):
        fails()
    assert calls == [8, 8]


def test_reduce_batch_size_fn_in_both_forms_and_passing_the_batch_size_is_an_error():
    tried = []

    def step_down(batch_size):
        return batch_size - 3

    def body(batch_size, extra):
        tried.append(batch_size)
        if batch_size > 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size + extra

    assert find_executable_batch_size(body, starting_batch_size=10, reduce_batch_size_fn=step_down)(100) == 104
    assert tried == [10, 7, 4]
    decorated = find_executable_batch_size(starting_batch_size=5, reduce_batch_size_fn=step_down)(body)
    assert decorated(extra=0) == 2
    with pytest.raises(TypeError, match=r"Batch size was passed into `body` as the first argument .* "
                                        r"Call `body\(extra=1\)`"):
        decorated(16, extra=1)


@pytest.mark.parametrize("error, reduce", [
    (torch.OutOfMemoryError(), True),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
    (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
    (RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
                  "non-contiguous input."), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                  "you tried to allocate 8 bytes."), True),
    (RuntimeError("XPU out of memory. Tried to allocate 1 GiB"), True),
    (RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"), True),
    (MemoryError(), True),
    (RuntimeError("Expected all tensors to be on the same device"), False),
    (ValueError("CUDA out of memory."), False),
])
def test_should_reduce_batch_size(error, reduce):
    assert should_reduce_batch_size(error) is reduce


def test_free_memory_and_release_memory_drop_references():
    big = torch.ones(1000)
    model = torch.nn.Linear(2, 2)
    big, model = release_memory(big, model)
    assert big is None and model is None
    assert free_memory() == []


@pytest.mark.processes
def test_a_worker_over_its_memory_limit_gets_a_clear_error():
    def greedy():
        return torch.ones(2**30).sum()  # 4 GB

    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(greedy, num_processes=2, device="cpu", memory_limit="2GB", timeout=60)
    message = str(caught.value)
    assert "DefaultCPUAllocator: can't allocate memory" in message
    assert "reached its memory_limit of 2.00 GiB" in message


@pytest.mark.parametrize("value, error", [("3 parsecs", LaunchArgumentError), ("10MB", LaunchArgumentError),
                                          (True, TypeError), (3.5, TypeError)])
@pytest.mark.processes
def test_bad_memory_limit_is_named(value, error):
    with pytest.raises(error, match="memory_limit"):
        notebook_launcher(lambda: None, num_processes=2, device="cpu", memory_limit=value)
