"""The private names of torch and Accelerate we patch or read exist on the installed versions (torch 2.13 here;
`make test-xla` runs this file on torch 2.9 too), and a launch on a torch that lacks one says so."""

import pytest
import torch

from notebook_launcher import last_run, notebook_launcher
from notebook_launcher.rank import ddp_watch
from notebook_launcher.rank.torch_names import PRIVATE_NAMES, missing


def test_every_private_name_we_patch_or_read_exists_here():
    assert missing(import_missing_modules=True) == []


def test_every_patch_of_ddp_is_in_the_list():
    import types

    listed = {(module, path) for module, path, _, _ in PRIVATE_NAMES}
    for owner, name, _ in ddp_watch._PATCHES:
        if not name.startswith("_"):
            continue  # a public method (register_comm_hook)
        if isinstance(owner, types.ModuleType):
            assert (owner.__name__, name) in listed, name
        else:
            assert (owner.__module__, f"{owner.__qualname__}.{name}") in listed, (owner, name)


def test_a_missing_name_is_named_with_what_is_lost(monkeypatch):
    monkeypatch.delattr(torch.nn.parallel.distributed.DistributedDataParallel, "_sync_buffers")
    assert missing() == ["torch.nn.parallel.distributed.DistributedDataParallel._sync_buffers (used by ddp_watch): "
                         "DDP's buffer broadcast is not recorded"]


def trains_a_ddp_model():
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
    model(torch.ones(3, 2)).sum().backward()
    return float(model.module.weight.grad.sum())


@pytest.mark.processes
def test_a_launch_on_a_torch_without_one_warns_once_and_still_runs(monkeypatch, capsys):
    monkeypatch.delattr(torch.nn.parallel.distributed.DistributedDataParallel, "_sync_buffers")
    result = notebook_launcher(trains_a_ddp_model, num_processes=2, device="cpu", display="text")
    assert result == 6.0 and last_run().status == "finished"
    out = capsys.readouterr().out
    assert out.count("warning: this torch lacks torch.nn.parallel.distributed.DistributedDataParallel"
                     "._sync_buffers (used by ddp_watch): DDP's buffer broadcast is not recorded") == 1, out


def test_ipykernel_routes_a_comm_message_through_the_hook_the_panel_sets():
    """The live panel's comm answers a request while a cell runs through ipykernel 7's per-comm routing hook
    (display/comm.py sets it); the installed ipykernel still asks a comm for it."""
    import inspect

    import ipykernel.kernelbase

    assert '"_reply_subshell_for"' in inspect.getsource(ipykernel.kernelbase)
