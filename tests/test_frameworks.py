"""The frameworks users train with, run under our launcher as their users write them: CPU, 2 ranks, no download.

Transformers' ``Trainer`` (a tiny GPT-2 built from a config, random token ids), Lightning Fabric's DDP
strategy, Accelerate's ``Accelerator`` (``gather_for_metrics``, gradient accumulation, ``print``), and
Accelerate's own notebook-launcher test functions with our launcher in place of theirs. A bare
``PartialState()`` is covered in test_accelerate_compat.py.
"""

import math
import multiprocessing
import time

import pytest

from notebook_launcher import last_run, notebook_launcher

pytestmark = pytest.mark.processes

# A hang fails the test within this, with every rank's stacks in the error, rather than at pytest's timeout.
RUN_TIMEOUT = 120


def _weights_digest(module) -> str:
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


# --- Transformers' Trainer -------------------------------------------------------------------------------------

NUM_SAMPLES, BATCH_SIZE = 32, 4


def train_tiny_gpt2(output_dir):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)  # the same initial model on both ranks, as in a script
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32, bos_token_id=0,
                        eos_token_id=0)
    model = GPT2LMHeadModel(config)
    initial = _weights_digest(model)

    class RandomTokens(torch.utils.data.Dataset):
        def __init__(self):
            self.ids = torch.randint(0, config.vocab_size, (NUM_SAMPLES, 16),
                                     generator=torch.Generator().manual_seed(1))

        def __len__(self):
            return NUM_SAMPLES

        def __getitem__(self, index):
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=BATCH_SIZE, num_train_epochs=1,
                             report_to=[], save_strategy="no", use_cpu=True, dataloader_num_workers=0,
                             logging_steps=1, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens())
    output = trainer.train()
    return {"global_step": trainer.state.global_step, "loss": output.training_loss,
            "world_size": trainer.args.world_size, "process_index": trainer.args.process_index,
            "distributed_type": str(trainer.accelerator.distributed_type),
            "initial": initial, "weights": _weights_digest(model)}


def test_transformers_trainer_trains_a_tiny_gpt2_on_two_cpu_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing is downloaded; this makes sure of it
    result = notebook_launcher(train_tiny_gpt2, args=(str(tmp_path / "trainer"),), num_processes=2, device="cpu",
                               timeout=RUN_TIMEOUT)
    results = last_run().results
    assert result == results[0]  # rank 0's value is what the call returns
    assert sorted(r["process_index"] for r in results.values()) == [0, 1]
    for r in results.values():
        assert r["world_size"] == 2
        assert r["distributed_type"] == "DistributedType.MULTI_CPU"
        assert r["global_step"] == NUM_SAMPLES // (2 * BATCH_SIZE)  # one epoch, each rank half of the samples
        assert math.isfinite(r["loss"])
    assert results[0]["weights"] == results[1]["weights"] != results[0]["initial"]  # trained, and in sync
    # Trainer logs from the main process only: every step's loss once, from rank 0.
    assert sum("'loss'" in line for line in last_run().output(rank=0)) == results[0]["global_step"]
    assert not any("'loss'" in line for line in last_run().output(rank=1))


# --- Lightning Fabric ------------------------------------------------------------------------------------------

def train_with_fabric():
    import torch
    import torch.distributed as dist
    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()  # required for devices > 1, as under torchrun; it sees the processes already exist
    torch.manual_seed(fabric.global_rank)  # different initial weights per rank: setup() broadcasts rank 0's
    model = torch.nn.Linear(8, 1)
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    data = torch.Generator().manual_seed(100 + fabric.global_rank)  # different batches per rank
    for _ in range(3):
        loss = model(torch.randn(16, 8, generator=data)).pow(2).mean()
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
    total = fabric.all_reduce(torch.tensor(float(fabric.global_rank)), reduce_op="sum")
    return {"world_size": fabric.world_size, "global_rank": fabric.global_rank,
            "external": fabric.strategy.cluster_environment.creates_processes_externally,
            "backend": dist.get_backend(), "total": total.item(), "initial": initial,
            "weights": {name: value.detach().clone() for name, value in model.state_dict().items()}}


def test_lightning_fabric_ddp_uses_the_launch_and_keeps_the_ranks_in_sync():
    import torch

    notebook_launcher(train_with_fabric, num_processes=2, device="cpu", timeout=RUN_TIMEOUT)
    results = last_run().results
    assert sorted(r["global_rank"] for r in results.values()) == [0, 1]
    for r in results.values():
        assert r["world_size"] == 2
        assert r["external"]  # Fabric found the processes we started, and started none of its own
        assert r["backend"] == "gloo"
        assert r["total"] == 1.0
    assert not torch.equal(results[0]["initial"]["weight"], results[1]["initial"]["weight"])
    for name, value in results[0]["weights"].items():
        assert torch.equal(value, results[1]["weights"][name])
        assert not torch.equal(value, results[0]["initial"][name])


# --- Accelerate's Accelerator ----------------------------------------------------------------------------------

def gather_ten_samples():
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    samples = torch.utils.data.TensorDataset(torch.arange(10, dtype=torch.float32))
    loader = accelerator.prepare(torch.utils.data.DataLoader(samples, batch_size=4))
    seen, gathered = [], []
    for (batch,) in loader:
        seen.append(batch.tolist())
        gathered.extend(accelerator.gather_for_metrics(batch).tolist())
    return {"seen": seen, "gathered": gathered}


def test_accelerate_gather_for_metrics_returns_each_sample_exactly_once():
    notebook_launcher(gather_ten_samples, num_processes=2, device="cpu", timeout=RUN_TIMEOUT)
    results = last_run().results
    # 10 samples, 2 ranks, batch 4: each rank sees 2 batches, the last ones padded with repeated samples...
    assert sum(len(batch) for r in results.values() for batch in r["seen"]) == 16
    for r in results.values():
        # ...which gather_for_metrics drops: exactly the 10 samples, on every rank.
        assert sorted(r["gathered"]) == [float(i) for i in range(10)]


def accumulate_gradients():
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(gradient_accumulation_steps=2)
    torch.manual_seed(0)
    samples = torch.utils.data.TensorDataset(torch.randn(16, 4))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer,
                                                   torch.utils.data.DataLoader(samples, batch_size=2))
    syncs, changed = [], []
    for (batch,) in loader:
        before = model.module.weight.detach().clone()
        with accelerator.accumulate(model):
            loss = model(batch).pow(2).mean()
            accelerator.backward(loss)
            syncs.append(accelerator.sync_gradients)
            optimizer.step()
            optimizer.zero_grad()
        changed.append(not torch.equal(before, model.module.weight))
    return {"syncs": syncs, "changed": changed, "weight": model.module.weight.detach().clone()}


def test_accelerate_gradient_accumulation_syncs_and_steps_every_second_batch():
    import torch

    notebook_launcher(accumulate_gradients, num_processes=2, device="cpu", timeout=RUN_TIMEOUT)
    results = last_run().results
    for r in results.values():
        assert r["syncs"] == [False, True, False, True]  # 16 samples, batch 2, 2 ranks: 4 batches per rank
        assert r["changed"] == r["syncs"]  # the optimizer steps only when the gradients were synced
    assert torch.equal(results[0]["weight"], results[1]["weight"])


def print_with_accelerator():
    from accelerate import Accelerator

    accelerator = Accelerator()
    accelerator.print("printed by the main process only")
    accelerator.wait_for_everyone()
    print(f"every rank prints this: {accelerator.process_index}")


def test_accelerate_print_prints_once_from_rank_0():
    notebook_launcher(print_with_accelerator, num_processes=2, device="cpu", timeout=RUN_TIMEOUT)
    run = last_run()
    assert run.output(rank=0).count("printed by the main process only") == 1
    assert "printed by the main process only" not in run.output(rank=1)
    assert "every rank prints this: 1" in run.output(rank=1)  # rank 1's output does reach the kernel


# --- Accelerate's own notebook-launcher tests, with our launcher --------------------------------------------------

@pytest.fixture
def accelerate_notebook_tests(monkeypatch):
    """accelerate/test_utils/scripts/test_notebook.py, calling our notebook_launcher with its own arguments
    (plus a timeout) on 2 processes."""
    from accelerate.test_utils.scripts import test_notebook

    def ours(*args, **kwargs):
        return notebook_launcher(*args, timeout=RUN_TIMEOUT, **kwargs)

    monkeypatch.setattr(test_notebook, "notebook_launcher", ours)
    monkeypatch.setattr(test_notebook, "NUM_PROCESSES", 2)
    return test_notebook


@pytest.mark.parametrize("name", ["test_can_initialize", "test_static_rdzv_backend", "test_c10d_rdzv_backend",
                                  "test_clean_cuda_fork"])
def test_accelerates_notebook_tests_launch(accelerate_notebook_tests, name):
    """Each as Accelerate runs it. On one node, rdzv_backend="c10d" launches as "static" does (a rendezvous is
    only needed across nodes); test_clean_cuda_fork checks only on a CUDA machine."""
    getattr(accelerate_notebook_tests, name)()
    run = last_run()
    assert run.status == "finished" and run.world_size == 2
    if name != "test_clean_cuda_fork":  # the others print PartialState() on every rank
        for rank in (0, 1):
            lines = run.output(rank=rank)
            assert "Distributed environment: DistributedType.MULTI_CPU  Backend: gloo" in lines
            assert "Num processes: 2" in lines and f"Process index: {rank}" in lines


def crack_the_nut_on_rank_1(queue):
    import torch.distributed as dist
    from accelerate.test_utils.scripts.test_notebook import tough_nut_function

    if dist.get_rank() == 1:
        tough_nut_function(queue)  # raises while the queue's count is above 0, counting it down
    dist.barrier()


def test_accelerates_fault_tolerance_function_restarts_every_rank_until_it_succeeds():
    """Accelerate's tough_nut_function with max_restarts=3: it fails three times, then succeeds.

    Their test_fault_tolerant calls it on both ranks, which is a race of its own (a rank that saw the queue
    non-empty waits in get() forever when the other took the last item and returned; under our launcher, which
    stops the other ranks at once, a rank can also be stopped while it holds the queue's lock): so one rank
    plays the nut, the other waits for it in a barrier. The queue is made and used in the kernel before the
    launch, as in their test."""
    queue = multiprocessing.get_context("fork").Queue()
    queue.put(3)
    notebook_launcher(crack_the_nut_on_rank_1, (queue,), num_processes=2, max_restarts=3, device="cpu",
                      timeout=RUN_TIMEOUT)
    run = last_run()
    assert run.status == "finished"
    assert run.attempts == 4  # every put of the failing rank reached the queue before it exited
    assert "PartialState:" in run.output(rank=1)  # printed in the attempt that cracked the nut
    assert queue.empty()


def test_accelerates_monitoring_test_ends_the_run_when_one_rank_fails(accelerate_notebook_tests):
    start = time.monotonic()
    accelerate_notebook_tests.test_monitoring()  # raises ChildFailedError matching rank 0's error, or fails
    # The other rank sleeps 100 s: the run is stopped long before (a generous bound, not a timing measurement).
    assert time.monotonic() - start < 60
    run = last_run()
    assert run.status == "failed"
    assert run.root_cause.rank == 0 and "I'm an even process" in run.root_cause.message

