"""Frameworks as their users write them, in a real Jupyter kernel (the only place a notebook launch happens).

- Lightning's ``Trainer`` and ``Fabric`` with ``strategy="ddp"`` (and ``"auto"``) run on the launch's ranks:
  a rank is not an interactive session, even where Lightning was imported in the kernel first;
- a launcher inside a launch (Lightning's ``ddp_notebook``, ``torch.multiprocessing.spawn``) fails at once,
  naming ``strategy="ddp"``;
- what a rank forks dies with it, even when the kernel is SIGKILLed.

Each kernel is shut down by ``running_kernel`` and checked gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal

import psutil
import pytest
from helpers.kernel import _assert_ok, _stream, _wait_until, run_cell, running_kernel

pytestmark = [pytest.mark.slow, pytest.mark.kernel]  # kernels, and the runs they start

RUN_TIMEOUT = 150  # a hang fails the cell with every rank's stacks, long before the cell's own bound
CELL_TIMEOUT = 240


def _run_ok(kc, code: str) -> str:
    """The cell's text on stdout, then on stderr (the text display writes the ranks' stderr lines there)."""
    reply, outputs = run_cell(kc, code, timeout=CELL_TIMEOUT)
    _assert_ok(reply, outputs)
    return _stream(outputs) + _stream(outputs, "stderr")


LIGHTNING_TRAINER_CELL = '''\
import lightning  # imported in the kernel before the launch, as a notebook does
import torch
from notebook_launcher import last_run, notebook_launcher

class Regression(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, _):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

def train(strategy):
    import torch.distributed as dist
    torch.manual_seed(0)
    model = Regression()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=4)
    trainer = lightning.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    return {{"world_size": trainer.world_size, "global_rank": trainer.global_rank, "steps": trainer.global_step,
            "external": trainer.strategy.cluster_environment.creates_processes_externally,
            "groups": dist.get_world_size(),
            "weight": model.layer.weight.detach().clone()}}

value = notebook_launcher(train, args=({strategy!r},), num_processes=2, device="cpu", display="text",
                          timeout={timeout})
results = last_run().results
print("rank 0 returned:", value["global_rank"] == 0 and value["steps"] == results[0]["steps"])
print("world sizes:", sorted((r["world_size"], r["groups"]) for r in results.values()))
print("steps:", sorted(r["steps"] for r in results.values()))
print("external:", all(r["external"] for r in results.values()))
print("in sync:", torch.equal(results[0]["weight"], results[1]["weight"]))
'''


def _assert_lightning_trained(text: str) -> None:
    assert "rank 0 returned: True" in text, text
    assert "world sizes: [(2, 2), (2, 2)]" in text, text
    assert "steps: [8, 8]" in text, text  # 64 samples, batch 4, two ranks: half of one rank's 16 steps
    assert "external: True" in text, text  # Lightning used our processes and started none
    assert "in sync: True" in text, text


def test_lightning_trainer_ddp_and_auto_train_on_the_launchs_ranks_in_a_kernel(tmp_path):
    with running_kernel(tmp_path) as (_, kc, _kernel):
        for strategy in ("ddp", "auto"):
            _assert_lightning_trained(_run_ok(kc, LIGHTNING_TRAINER_CELL.format(strategy=strategy,
                                                                                timeout=RUN_TIMEOUT)))


FABRIC_CELL = '''\
import torch
from lightning.fabric import Fabric  # imported in the kernel before the launch
from notebook_launcher import last_run, notebook_launcher

def train(strategy):
    fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    torch.manual_seed(fabric.global_rank)  # different initial weights: setup() broadcasts rank 0's
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    data = torch.Generator().manual_seed(100 + fabric.global_rank)
    for _ in range(3):
        loss = model(torch.randn(16, 8, generator=data)).pow(2).mean()
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
    total = fabric.all_reduce(torch.tensor(float(fabric.global_rank)), reduce_op="sum")
    return {{"world_size": fabric.world_size, "global_rank": fabric.global_rank, "total": total.item(),
            "external": fabric.strategy.cluster_environment.creates_processes_externally,
            "weight": model.weight.detach().clone()}}

value = notebook_launcher(train, args=({strategy!r},), num_processes=2, device="cpu", display="text",
                          start_method={start_method!r}, timeout={timeout})
results = last_run().results
print("rank 0 returned:", value["global_rank"] == 0)
print("world sizes:", sorted(r["world_size"] for r in results.values()))
print("totals:", sorted(r["total"] for r in results.values()))
print("external:", all(r["external"] for r in results.values()))
print("in sync:", torch.equal(results[0]["weight"], results[1]["weight"]))
'''


@pytest.mark.parametrize("strategy,start_method", [("ddp", "fork"), ("auto", "spawn")])
def test_lightning_fabric_runs_on_the_launchs_ranks_in_a_kernel(tmp_path, strategy, start_method):
    """A spawned rank runs IPython's shell for display(), which sets sys.ps1 again: it must not count."""
    with running_kernel(tmp_path) as (_, kc, _kernel):
        text = _run_ok(kc, FABRIC_CELL.format(strategy=strategy, start_method=start_method, timeout=RUN_TIMEOUT))
    assert "rank 0 returned: True" in text, text
    assert "world sizes: [2, 2]" in text, text
    assert "totals: [1.0, 1.0]" in text, text
    assert "external: True" in text, text
    assert "in sync: True" in text, text


NESTED_CELL = '''\
import time
import lightning
import torch
from notebook_launcher import RankFailedError, notebook_launcher

def lightning_ddp_notebook():
    lightning.Fabric(accelerator="cpu", devices=2, strategy="ddp_notebook").launch(lambda fabric: None)

def torch_spawn():
    torch.multiprocessing.spawn(print, nprocs=2)

def accelerate_launcher():
    from accelerate import notebook_launcher as accelerates
    accelerates(print, num_processes=2)

for function in (lightning_ddp_notebook, torch_spawn, accelerate_launcher):
    started = time.monotonic()
    try:
        notebook_launcher(function, num_processes=2, device="cpu", display="text", timeout={timeout})
    except RankFailedError as error:
        print(function.__name__, "failed:", str(error).splitlines()[0])
        print(function.__name__, "in seconds:", time.monotonic() - started < {timeout} / 2)
'''


def test_a_launcher_inside_a_launch_fails_at_once_naming_strategy_ddp(tmp_path):
    """Lightning's ddp_notebook, torch.multiprocessing.spawn and Accelerate's notebook_launcher called in the
    launched function would start ranks below each rank that can never meet: each fails with the fix, long
    before the run's timeout (a generous bound: the cell reports whether it came before half of it)."""
    with running_kernel(tmp_path) as (_, kc, kernel):
        text = _run_ok(kc, NESTED_CELL.format(timeout=RUN_TIMEOUT))
        for name in ("lightning_ddp_notebook", "torch_spawn", "accelerate_launcher"):
            failed = [line for line in text.splitlines() if line.startswith(f"{name} failed:")]
            assert failed and "LauncherInLaunchError" in failed[0], text
            assert "strategy='ddp'" in failed[0], text
            assert f"{name} in seconds: True" in text, text
        assert kernel.children(recursive=True) == []


KILLED_KERNEL_CELL = '''\
import multiprocessing, os, time
import lightning
import torch
from notebook_launcher import notebook_launcher

class Sleeps(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, _):
        helper = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
        helper.start()  # a process of the rank's own, as a callback or a data service starts one
        open(os.path.join({folder!r}, str(self.global_rank)), "w").close()
        time.sleep(600)  # the kernel is killed meanwhile

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

def train():
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 2)), batch_size=4,
                                         num_workers=2, persistent_workers=True)
    trainer = lightning.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Sleeps(), loader)

notebook_launcher(train, num_processes=2, device="cpu", display="text")
'''


def test_a_kernel_sigkilled_while_lightning_trains_leaves_no_process_the_ranks_forked(tmp_path):
    """Each rank's DataLoader workers and its own multiprocessing child are running when the kernel dies by
    SIGKILL (nothing of ours can run in it then): every one of them goes, not only the ranks."""
    folder = tmp_path / "ready"
    folder.mkdir()
    with running_kernel(tmp_path) as (_, kc, kernel):
        kc.execute(KILLED_KERNEL_CELL.format(folder=str(folder)))
        assert _wait_until(lambda: len(os.listdir(folder)) == 2, CELL_TIMEOUT), "the ranks never started training"
        processes = kernel.children(recursive=True)
        named = [process.cmdline() for process in processes]
        assert len(processes) >= 2 + 2 * 2 + 2, named  # 2 ranks, their DataLoader workers, their helpers
        os.kill(kernel.pid, signal.SIGKILL)
        try:
            _, alive = psutil.wait_procs(processes, timeout=30)  # bounds the wait; they go at once
            assert alive == [], [process.pid for process in alive]
        finally:
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    process.kill()


CRASH_CELL = '''\
import os
import torch
import torch.distributed as dist
from notebook_launcher import RankFailedError, notebook_launcher

def mismatched_all_reduce():
    rank = dist.get_rank()
    # a line as torch's C++ log writes it once the process group exists (its own rank prefix first)
    os.write(2, f"[rank{{rank}}]:[W1204 17:00:00.000000000 ProcessGroupGloo.cpp:1] Warning: a C++ warning\\n".encode())
    dist.all_reduce(torch.ones(200_000 if rank == 1 else 100_000))  # gloo aborts the process that receives more

try:
    notebook_launcher(mismatched_all_reduce, num_processes=2, device="cpu", display="text", timeout={timeout})
except RankFailedError as error:
    print("error:", error)
'''


def test_a_rank_aborted_in_gloo_shows_glooss_message_then_the_users_frames_in_a_kernel(tmp_path):
    """gloo's own report (why it aborted) comes first, then faulthandler's line and the function's frame, as
    the notebook names its cell; notebook_launcher's frames and those the rank inherited from the kernel
    (IPython's, ipykernel's) are cut with a count. A C++ log line is prefixed by its rank once."""
    with running_kernel(tmp_path) as (_, kc, _kernel):
        text = _run_ok(kc, CRASH_CELL.format(timeout=RUN_TIMEOUT))
    assert "killed by SIGABRT" in text, text
    crash = text.split("stderr:\n", 1)[1].split("\nOther ranks:", 1)[0].splitlines()
    assert crash[0].strip() == "terminate called after throwing an instance of 'gloo::EnforceNotMet'", text
    assert "Received data size doesn't match expected size" in crash[1], text
    assert crash[2].strip() == "Fatal Python error: Aborted", text
    assert any(re.search(r"cell In\[\d+\], line 10 in mismatched_all_reduce", line) for line in crash), text
    assert re.fullmatch(r"\s*\(\d+ frames of notebook_launcher's own below these are not shown; the run log "
                        r"has them\)", crash[-1]), text
    assert not any("ipykernel" in line or "IPython" in line or "/notebook_launcher/" in line for line in crash), text
    assert len(crash) < 15, text
    warnings = [line for line in text.splitlines() if line.endswith("Warning: a C++ warning")]
    assert sorted(line.split("]")[0] for line in warnings) == ["[rank 0", "[rank 1"], text
    assert all(re.match(r"\[rank \d\] \[W1204 ", line) for line in warnings), text


NOTEBOOK_MODEL_CELL = '''\
import torch
from notebook_launcher import notebook_launcher

model = torch.nn.Linear(4, 1)
data = torch.randn(16, 4)  # a tensor that is not trained
before = model.weight.detach().clone()

def train():
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        optimizer.zero_grad()
        model(data).pow(2).mean().backward()
        optimizer.step()
    return model(data).pow(2).mean().item()

def train_and_return_the_weights():
    train()
    return model.state_dict()

def mean_of_the_data():
    return data.mean().item()

print("--- returns the loss")
notebook_launcher(train, num_processes=2, device="cpu", display="text")
print("unchanged:", torch.equal(model.weight, before))
print("--- returns the weights")
model.load_state_dict(notebook_launcher(train_and_return_the_weights, num_processes=2, device="cpu",
                                        display="text"))
print("trained:", not torch.equal(model.weight, before))
print("--- uses data only")
notebook_launcher(mean_of_the_data, num_processes=2, device="cpu", display="text")
'''


MAGIC_TRAINS = """\
%%accelerate -n 2 --device cpu
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
model(data).pow(2).mean().backward()
optimizer.step()
"""


def test_a_notebook_model_trained_in_the_ranks_and_not_returned_is_said_unchanged(tmp_path):
    """One line after the run that trained copies of the notebook's ``model`` and returned only a loss, with how
    to bring the weights back; none when the weights come back, or when the function used an untrained tensor.
    The same for a cell run by ``%%accelerate``, whose assigned names come back."""
    with running_kernel(tmp_path) as (_, kc, _kernel):
        text = _run_ok(kc, NOTEBOOK_MODEL_CELL)
        _run_ok(kc, "%load_ext notebook_launcher")
        magic_loss = _run_ok(kc, MAGIC_TRAINS + "loss = model(data).pow(2).mean().item()\n")
        magic_weights = _run_ok(kc, MAGIC_TRAINS + "weights = model.state_dict()\n")
    assert "`weights = model.state_dict()`" in magic_loss and "`model.load_state_dict(weights)`" in magic_loss
    assert "trained copies" not in magic_weights, magic_weights
    loss, weights, data = (part for part in text.split("--- ")[1:])
    notes = [line for line in loss.splitlines() if "trained copies" in line]
    assert len(notes) == 1, text
    assert "copies of the notebook's `model`" in notes[0] and "is unchanged" in notes[0], text
    assert "`return model.state_dict()`" in notes[0] and "`model.load_state_dict(" in notes[0], text
    assert "unchanged: True" in loss, text
    assert "trained: True" in weights and "trained copies" not in weights, text
    assert "trained copies" not in data, text


FORKED_CHILD_CELL = '''\
import multiprocessing, os, time
import torch
import torch.distributed as dist
from notebook_launcher import LaunchTimeoutError, notebook_launcher

def in_a_forked_child(group, folder):
    open(os.path.join(folder, "child"), "w").close()
    dist.all_reduce(torch.ones(1), group=group)  # the child's own, on a copy of the rank's group: it never ends

def rank_1_waits_for_its_child(folder):
    alone = [dist.new_group([0]), dist.new_group([1])]
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 1:
        child = multiprocessing.get_context("fork").Process(target=in_a_forked_child, args=(alone[1], folder))
        child.start()
        child.join()
    else:
        dist.barrier()  # rank 1 never joins it

try:
    notebook_launcher(rank_1_waits_for_its_child, args=({folder!r},), num_processes=2, device="cpu",
                      display="text", timeout={timeout})
except LaunchTimeoutError as error:
    print("child started:", os.path.exists(os.path.join({folder!r}, "child")))
    print(error)
'''


def test_a_process_a_rank_forked_never_tells_the_ranks_story(tmp_path):
    """A child forked by rank 1 waits in a collective of its own while rank 1 waits for the child: the story at
    the timeout is rank 1's (in its own code, in ``join``), never the child's collective told as rank 1's."""
    folder = tmp_path / "marks"
    folder.mkdir()
    with running_kernel(tmp_path) as (_, kc, kernel):
        text = _run_ok(kc, FORKED_CHILD_CELL.format(folder=str(folder), timeout=20))
        assert kernel.children(recursive=True) == []
    assert "child started: True" in text, text
    rank_1 = [line for line in text.splitlines() if line.startswith("rank 1:")]
    assert rank_1 and "in any collective" in rank_1[0], text
    assert "in_a_forked_child" not in text.split("Python stacks of rank 1")[0], text
    assert "different collectives" not in text, text
