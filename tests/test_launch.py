"""Real launches: real processes, a real gloo process group, fork and spawn."""

import os
import signal
import stat

import pytest
import torch

from notebook_launcher import last_run, notebook_launcher
from notebook_launcher.schema.runlog import read_run_log

pytestmark = pytest.mark.processes


def sum_of_ranks(scale):
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} sees {value.item()}")
    return {"rank": dist.get_rank(), "total": value.item() * scale, "env_rank": int(os.environ["RANK"])}


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("num_processes", [2, 3])
def test_all_reduce_and_rank0_result(num_processes, start_method, capsys):
    result = notebook_launcher(sum_of_ranks, args=(2,), num_processes=num_processes, start_method=start_method,
                               device="cpu")
    expected_total = sum(range(1, num_processes + 1)) * 2
    assert result == {"rank": 0, "total": expected_total, "env_rank": 0}
    run = last_run()
    assert run.status == "finished"
    assert run.start_method == start_method
    assert sorted(run.results) == list(range(num_processes))
    assert [run.results[r]["env_rank"] for r in range(num_processes)] == list(range(num_processes))
    assert run.exit_codes == {rank: 0 for rank in range(num_processes)}
    assert run.output(stream="stderr") == []  # a clean run says nothing on stderr (no teardown noise)
    out = capsys.readouterr().out
    assert f"start method {start_method}" in out
    for rank in range(num_processes):
        assert f"[rank {rank}] rank {rank} of {num_processes} sees {expected_total / 2}" in out


NOTEBOOK_CELL = '''
import torch
OFFSET = 10.0

def helper(x):
    return x + OFFSET

def train(t):
    import torch.distributed as dist
    t = t * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return helper(t)
'''


def test_notebook_defined_function_under_spawn_is_sent_with_cloudpickle():
    """A function defined in a notebook lives in __main__, which a spawned child cannot import."""
    notebook_namespace = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, "<notebook cell>", "exec"), notebook_namespace)
    result = notebook_launcher(notebook_namespace["train"], args=(torch.ones(2),), num_processes=2,
                               start_method="spawn", device="cpu")
    assert torch.equal(result, torch.full((2,), 13.0))


def test_worker_environment_for_torch_distributed_and_accelerate():
    def environment():
        import torch.distributed as dist

        keys = ["MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU"]
        return {key: os.environ.get(key) for key in keys} | {"backend": dist.get_backend()}

    notebook_launcher(environment, num_processes=2, mixed_precision="bf16", device="cpu")
    run = last_run()
    for rank in (0, 1):
        env = run.results[rank]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0
        assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
        assert env["ACCELERATE_USE_CPU"] == "true"
        assert env["backend"] == "gloo"
    assert "RANK" not in os.environ and "ACCELERATE_USE_CPU" not in os.environ  # nothing leaks into the kernel


def chatty_then_killed(lines):
    import ctypes

    import torch.distributed as dist

    if dist.get_rank() == 1:
        for index in range(lines):
            print(f"line {index} " + "x" * 50)
        os.write(1, b"raw fd write without newline")  # C-level writes reach the kernel too
        libc = ctypes.CDLL(None)
        libc.fflush(None)
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        for index in range(lines):
            print(f"other {index}")
    return "done"


def test_every_line_arrives_even_when_the_rank_is_sigkilled():
    with pytest.raises(Exception):
        notebook_launcher(chatty_then_killed, args=(3000,), num_processes=2, device="cpu")
    run = last_run()
    lines = run.output(rank=1, stream="stdout")
    printed = [line for line in lines if line.startswith("line ")]
    assert printed == [f"line {index} " + "x" * 50 for index in range(3000)]
    assert "raw fd write without newline" in lines  # C-level output, on its own pipe
    assert run.exit_codes[1] == -signal.SIGKILL


def interleaved_printer():
    import torch.distributed as dist

    rank = dist.get_rank()
    for index in range(500):
        print(f"rank-{rank}-line-{index}", flush=False)
    return rank


def test_lines_of_two_ranks_are_never_glued(capsys):
    notebook_launcher(interleaved_printer, num_processes=2, device="cpu")
    out = capsys.readouterr().out.splitlines()
    for rank in (0, 1):
        mine = [line for line in out if line.startswith(f"[rank {rank}] ")]
        assert mine == [f"[rank {rank}] rank-{rank}-line-{index}" for index in range(500)]


def test_log_line_prefix_template_is_honoured(capsys):
    def hello():
        print("hello")

    notebook_launcher(hello, num_processes=2, device="cpu", log_line_prefix_template="${role_name}-${rank}> ")
    out = capsys.readouterr().out
    assert "default-0> hello" in out and "default-1> hello" in out


def test_stderr_lines_and_warnings_arrive(capsys):
    def warn():
        import sys
        import warnings

        warnings.warn("careful now")
        print("to stderr", file=sys.stderr)

    notebook_launcher(warn, num_processes=2, device="cpu")
    assert "to stderr" in last_run().output(rank=1, stream="stderr")
    warning_records = [e.data for e in last_run().events if e.kind == "log" and e.rank == 1]
    assert warning_records[0]["logger"] == "py.warnings" and "UserWarning: careful now" in warning_records[0]["message"]
    captured = capsys.readouterr()
    assert "[rank 1] to stderr" in captured.err
    assert "[rank 1] WARNING py.warnings: " in captured.out and "UserWarning: careful now" in captured.out


def test_run_log_on_disk_is_private_and_complete(tmp_path):
    notebook_launcher(sum_of_ranks, args=(1,), num_processes=2, device="cpu")
    run = last_run()
    assert stat.S_IMODE(os.stat(run.run_dir).st_mode) == 0o700
    records = read_run_log(run.run_dir)
    texts = [r["data"]["text"] for r in records if r["kind"] == "stream"]
    assert "rank 1 of 2 sees 3.0" in texts
    assert {r["kind"] for r in records} >= {"status", "stream", "result", "exit"}
    assert os.path.exists(os.path.join(run.run_dir, "run.json"))


def test_state_dict_comes_back_with_its_metadata():
    def train():
        model = torch.nn.Linear(3, 2)
        return model.state_dict()

    state = notebook_launcher(train, num_processes=2, device="cpu")
    assert set(state) == {"weight", "bias"}
    assert hasattr(state, "_metadata")
    torch.nn.Linear(3, 2).load_state_dict(state)


def test_single_process_runs_in_the_kernel():
    def where():
        return os.getpid()

    assert notebook_launcher(where, num_processes=1, device="cpu") == os.getpid()
    assert last_run().status == "finished"


def test_busy_port_is_replaced_by_a_free_one(capsys):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = notebook_launcher(sum_of_ranks, args=(1,), num_processes=2, device="cpu", use_port=str(port))
    assert result["total"] == 3.0
    assert f"port {port} is busy" in capsys.readouterr().out


def test_max_restarts_relaunches_all_ranks(tmp_path):
    marker = tmp_path / "failed-once"

    def flaky():
        import torch.distributed as dist

        if dist.get_rank() == 1 and not marker.exists():
            marker.write_text("x")
            raise RuntimeError("transient")
        dist.barrier()
        return "ok"

    assert notebook_launcher(flaky, num_processes=2, device="cpu", max_restarts=1) == "ok"
    run = last_run()
    assert run.attempts == 2 and run.status == "finished"
    assert any(e.kind == "restart" and "restarting all ranks" in e.data["text"] and e.data["attempt"] == 2
               for e in run.events)


CONCURRENT_LAUNCHES = """
import sys
from notebook_launcher import notebook_launcher

def work():
    import torch, torch.distributed as dist
    value = torch.ones(1)
    dist.all_reduce(value)
    return value.item()

for _ in range(5):
    assert notebook_launcher(work, num_processes=2, device="cpu", timeout=60) == 2.0
print("all fine")
"""


def test_two_programs_launching_on_the_default_port_at_once_never_cross(tmp_path):
    """Two notebooks on one machine both ask for port 29500: each run gets a port of its own, held by the
    kernel from the check until rank 0 serves on it, so no rank joins the other program's group."""
    import subprocess
    import sys

    script = tmp_path / "launch_five.py"
    script.write_text(CONCURRENT_LAUNCHES)
    programs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for _ in range(2)]
    try:
        outputs = [program.communicate(timeout=240)[0] for program in programs]
    finally:
        for program in programs:
            program.kill()  # (their workers die with them: PR_SET_PDEATHSIG)
            program.wait()
    for program, output in zip(programs, outputs):
        assert program.returncode == 0, output
        assert "all fine" in output


def test_input_in_a_worker_fails_at_once_with_a_hint():
    def asks():
        return input("learning rate? ")

    with pytest.raises(Exception) as caught:
        notebook_launcher(asks, num_processes=2, device="cpu", timeout=30)
    assert "EOFError: input() is not available in a launched worker" in str(caught.value)


def test_num_processes_1_gives_the_function_a_one_process_group_and_restores_the_kernel():
    def ddp_step():
        import torch.distributed as dist

        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
        model(torch.ones(1, 2)).sum().backward()
        return dist.get_world_size(), os.environ["ACCELERATE_MIXED_PRECISION"]

    env_before = dict(os.environ)
    assert notebook_launcher(ddp_step, num_processes=1, device="cpu", mixed_precision="bf16") == (1, "bf16")
    assert not torch.distributed.is_initialized()
    ours = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU")
    assert {key: os.environ.get(key) for key in ours} == {key: env_before.get(key) for key in ours}


def test_the_users_atexit_handlers_run_in_the_worker(tmp_path):
    def registers():
        import atexit

        rank = int(os.environ["RANK"])
        atexit.register(lambda: (tmp_path / f"flushed-{rank}").write_text("yes"))

    notebook_launcher(registers, num_processes=2, device="cpu")
    assert (tmp_path / "flushed-0").read_text() == "yes" and (tmp_path / "flushed-1").read_text() == "yes"


def test_prints_and_log_records_of_a_rank_keep_their_order(capsys):
    def interleaved():
        from notebook_launcher import get_logger

        logger = get_logger("mixed", log_level="INFO")
        for index in range(200):
            print(f"print {index}")
            logger.info(f"log {index}", main_process_only=False)

    notebook_launcher(interleaved, num_processes=2, device="cpu")
    out = capsys.readouterr().out.splitlines()
    mine = [line for line in out if line.startswith("[rank 1] ")]
    expected = []
    for index in range(200):
        expected += [f"[rank 1] print {index}", f"[rank 1] INFO mixed: log {index}"]
    assert mine == expected
