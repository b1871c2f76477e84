"""GPU checks, for a machine with CUDA GPUs: collected with the rest (marker ``gpu``) and skipped without CUDA.

Run them with ``tests/gpu/run.sh``. Each check runs in a fresh Python process, because initializing CUDA is for
the life of a process and several checks are about what the kernel has or has not initialized.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUS = torch.cuda.device_count() if torch.backends.cuda.is_built() else 0

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS == 0, reason="no CUDA GPU on this machine"), pytest.mark.processes]
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")


def in_a_fresh_kernel(code: str, timeout: float = 240) -> str:
    """Run ``code`` as the kernel would (a new process, notebook_launcher importable); its stdout."""
    completed = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                               timeout=timeout, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO})
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return completed.stdout


def test_device_auto_counts_gpus_without_initializing_cuda_in_the_kernel():
    out = in_a_fresh_kernel("""
        import torch
        from notebook_launcher.plan import cuda_device_count, detect_device
        print(detect_device(), cuda_device_count(), torch.cuda.is_initialized())
    """)
    assert out.split() == ["cuda", str(GPUS), "False"]


def test_one_rank_on_cuda_runs_in_the_kernel_and_returns_its_tensor_where_it_is():
    # num_processes=1 runs the function in the kernel itself: its value is returned as it is, nothing copied
    # (a worker's result is moved to the CPU; that path is checked with two GPUs below).
    out = in_a_fresh_kernel("""
        import torch
        from notebook_launcher import notebook_launcher
        def on_gpu():
            return torch.ones(4, device="cuda") * 2
        result = notebook_launcher(on_gpu, num_processes=1, device="cuda")
        print(result.device, result.sum().item())
    """)
    assert out.split()[-2:] == ["cuda:0", "8.0"]


def test_after_cuda_init_in_the_kernel_spawn_is_chosen_and_fork_is_refused_naming_it():
    out = in_a_fresh_kernel("""
        import torch
        from notebook_launcher import LaunchArgumentError
        from notebook_launcher.plan import choose_start_method
        torch.cuda.init()
        print(choose_start_method("auto", "cuda"))
        try:
            choose_start_method("fork", "cuda")
        except LaunchArgumentError as error:
            print("refused:", error)
    """)
    assert "('spawn', 'fork is not safe here (CUDA is already initialized in this kernel" in out
    assert "refused: start_method='fork' cannot be used: CUDA is already initialized" in out


def test_more_ranks_than_gpus_is_refused_before_anything_starts():
    out = in_a_fresh_kernel(f"""
        from notebook_launcher import LaunchArgumentError, notebook_launcher
        try:
            notebook_launcher(print, num_processes={GPUS + 1}, device="cuda")
        except LaunchArgumentError as error:
            print("refused:", error)
    """)
    assert f"refused: num_processes={GPUS + 1} asks for more GPU ranks than the {GPUS} CUDA GPU(s)" in out


def test_a_real_cuda_out_of_memory_error_is_retried_at_a_smaller_batch():
    out = in_a_fresh_kernel("""
        import sys
        sys.path.insert(0, "tests/gpu")
        from check_cuda_oom import main
        print("exit", main())
    """, timeout=420)
    assert "exit 0" in out and "one process: finished at batch size 2" in out


def test_mixed_precision_reaches_accelerate_on_the_gpu():
    out = in_a_fresh_kernel("""
        from notebook_launcher import notebook_launcher
        def precision():
            from accelerate import Accelerator
            return Accelerator().mixed_precision
        print(notebook_launcher(precision, num_processes=1, device="cuda", mixed_precision="bf16"))
    """)
    assert out.split()[-1] == "bf16"


@two_gpus
def test_nccl_all_reduce_across_every_gpu():
    out = in_a_fresh_kernel(f"""
        import torch, torch.distributed as dist
        from notebook_launcher import notebook_launcher
        def reduce():
            t = torch.ones(1, device="cuda") * (dist.get_rank() + 1)
            dist.all_reduce(t)
            return dist.get_backend(), t.item()
        print(notebook_launcher(reduce, num_processes={GPUS}, device="cuda"))
    """)
    assert f"('nccl', {float(sum(range(1, GPUS + 1)))})" in out


@two_gpus
def test_debug_mode_catches_a_shape_mismatch_on_nccl():
    out = in_a_fresh_kernel(f"""
        import torch, torch.distributed as dist
        from notebook_launcher import RankFailedError, notebook_launcher
        from notebook_launcher.ops import gather
        def mismatch():
            gather(torch.ones(1 + dist.get_rank(), device="cuda"))
        try:
            notebook_launcher(mismatch, num_processes={GPUS}, device="cuda", debug=True)
        except RankFailedError as error:
            print(str(error).splitlines()[0])
    """)
    assert "DistributedOperationException" in out


@two_gpus
def test_an_out_of_memory_step_down_restarts_every_gpu_rank_at_the_agreed_size():
    out = in_a_fresh_kernel("""
        import sys
        sys.path.insert(0, "tests/gpu")
        from check_cuda_oom import main
        print("exit", main())
    """, timeout=420)
    assert "exit 0" in out and "GPU rank(s): finished at batch size 2" in out


@two_gpus
def test_a_hang_on_nccl_gets_a_notice_naming_the_busy_rank():
    out = in_a_fresh_kernel(f"""
        import time, torch, torch.distributed as dist
        from notebook_launcher import last_run, notebook_launcher
        def busy_then_reduce():
            if dist.get_rank() == 1:
                end = time.time() + 6
                while time.time() < end:
                    pass
            dist.all_reduce(torch.ones(1, device="cuda"))
        notebook_launcher(busy_then_reduce, num_processes={GPUS}, device="cuda", hang_warning=2, display="text")
        [opened] = [e.data for e in last_run().events if e.kind == "hang_notice" and e.data["state"] == "open"]
        print("notice", opened["ranks"]["1"]["state"], opened["ranks"]["0"]["state"])
    """)
    assert "notice busy waiting" in out


@two_gpus
def test_balance_reads_each_gpus_allocator_and_names_the_slow_and_the_large_rank():
    out = in_a_fresh_kernel(f"""
        import time, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from notebook_launcher import last_run, notebook_launcher
        def train():
            model = DistributedDataParallel(torch.nn.Linear(256, 256).cuda())
            held = torch.ones((1024 if dist.get_rank() == 1 else 256) * 2**20 // 4, device="cuda")
            for _ in range(20):
                if dist.get_rank() == 1:
                    time.sleep(0.05)
                model(torch.randn(32, 256, device="cuda")).sum().backward()
            torch.cuda.synchronize()
        notebook_launcher(train, num_processes={GPUS}, device="cuda", display="text")
        balance = last_run().balance
        total = torch.cuda.get_device_properties(0).total_memory
        print("straggler", balance.straggler, "device", balance.device_memory[0] == total,
              "uneven", balance.peak_memory[1] > 2 * balance.peak_memory[0] > 0)
    """)
    assert "straggler 1 device True uneven True" in out and "memory: rank 1 peaked at" in out


@two_gpus
def test_every_gpu_ranks_state_dict_comes_back_bit_for_bit_as_the_rank_saved_it(tmp_path):
    out = in_a_fresh_kernel(f"""
        import torch
        from notebook_launcher import last_run, notebook_launcher
        def train():
            import torch.distributed as dist
            rank = dist.get_rank()
            torch.manual_seed(rank)
            model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 256)).cuda()
            state = model.state_dict()
            torch.save({{k: v.cpu() for k, v in state.items()}}, f"{tmp_path}/rank{{rank}}.pt")
            return state
        notebook_launcher(train, num_processes=2, device="cuda", results="all", display="text")
        results = last_run().results
        for rank in (0, 1):
            saved = torch.load(f"{tmp_path}/rank{{rank}}.pt")
            got = results[rank]
            same = all(torch.equal(got[k], saved[k]) and got[k].device.type == "cpu" for k in saved)
            print("rank", rank, "same" if same and set(got) == set(saved) else "DIFFERENT")
    """)
    assert out.split()[-6:] == ["rank", "0", "same", "rank", "1", "same"]
