"""Frameworks as their users write them, in a real Jupyter kernel (the only place a notebook launch happens).

- Lightning's ``Trainer`` and ``Fabric`` with ``strategy="ddp"`` (and ``"auto"``) run on the launch's ranks:
  a rank is not an interactive session, even where Lightning was imported in the kernel first;
- a launcher inside a launch (Lightning's ``ddp_notebook``, ``torch.multiprocessing.spawn``) fails at once,
  naming ``strategy="ddp"``;
- what a rank forks dies with it, even when the kernel is SIGKILLed.

Each kernel is shut down by ``running_kernel`` and checked gone.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from test_kernel import _assert_ok, _stream, _wait_until, run_cell, running_kernel

RUN_TIMEOUT = 150  # a hang fails the cell with every rank's stacks, long before the cell's own bound
CELL_TIMEOUT = 240


def _run_ok(kc, code: str) -> str:
    reply, outputs = run_cell(kc, code, timeout=CELL_TIMEOUT)
    _assert_ok(reply, outputs)
    return _stream(outputs)


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
