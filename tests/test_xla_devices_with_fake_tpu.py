"""How a launch on device="xla" counts a TPU host's devices, with a fake ``torch_xla._internal.tpu`` (this machine
has no TPU; PJRT's CPU device, which it can run, is tested on the real torch_xla in tests/xla, `make test-xla`).

Only the count is faked: the chips and cores torch_xla's own helpers would read from PCI and the TPU's metadata.
"""

import importlib.machinery
import sys
import types

import pytest

from notebook_launcher import LaunchArgumentError, notebook_launcher
from notebook_launcher.plan import make_plan


def fake_tpu_host(monkeypatch, chips: int, cores_per_chip: int):
    torch_xla = types.ModuleType("torch_xla")
    torch_xla.__spec__ = importlib.machinery.ModuleSpec("torch_xla", None)
    internal = types.ModuleType("torch_xla._internal")
    tpu = types.ModuleType("torch_xla._internal.tpu")
    tpu.num_available_chips = lambda: chips
    tpu.num_local_processes = lambda: chips
    tpu.num_logical_cores_per_chip = lambda: cores_per_chip
    for name, module in (("torch_xla", torch_xla), ("torch_xla._internal", internal),
                         ("torch_xla._internal.tpu", tpu)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setenv("PJRT_DEVICE", "TPU")


def test_tpu_v4_with_fake_tpu_module_runs_one_rank_per_chip(monkeypatch):
    fake_tpu_host(monkeypatch, chips=4, cores_per_chip=1)
    plan = make_plan(function=print, device="xla")
    assert plan.num_processes == 4 and plan.world_size == 4 and plan.backend == "xla"
    assert plan.xla.processes == 4 and plan.env_for(0)["PJRT_DEVICE"] == "TPU"
    assert plan.describe().startswith("4 ordinals (PJRT TPU: one process per device) on xla (xla)")
    assert not plan.runs_in_kernel and make_plan(function=print, device="xla", num_processes=4).num_processes == 4


def test_tpu_v3_with_fake_tpu_module_runs_two_cores_per_chip_as_threads(monkeypatch):
    fake_tpu_host(monkeypatch, chips=4, cores_per_chip=2)
    plan = make_plan(function=print, device="xla")
    assert plan.num_processes == 8 and plan.xla.threads_per_process == 2
    assert "8 devices as threads of 4 processes" in plan.describe()


@pytest.mark.processes
def test_a_count_that_is_not_the_tpus_with_fake_tpu_module_is_refused_naming_both(monkeypatch):
    fake_tpu_host(monkeypatch, chips=4, cores_per_chip=1)
    refused = r"num_processes=8, but this host has 4 TPU device\(s\), by torch_xla.s count, .* Fix: pass num_processes=4"
    with pytest.raises(LaunchArgumentError, match=refused):
        notebook_launcher(print, num_processes=8, device="xla")


def test_a_tpu_that_torch_xla_cannot_find_with_fake_tpu_module_says_what_to_do(monkeypatch):
    fake_tpu_host(monkeypatch, chips=0, cores_per_chip=1)
    with pytest.raises(LaunchArgumentError, match="finds no TPU chip on this host; set PJRT_DEVICE=CPU"):
        make_plan(function=print, device="xla")


@pytest.mark.processes
def test_xla_without_torch_xla_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_xla", None)  # not importable, as on a machine without it
    with pytest.raises(LaunchArgumentError, match=r"device='xla' needs torch_xla, which is not importable here"):
        notebook_launcher(print, device="xla")


def test_xla_across_nodes_is_refused(monkeypatch):
    fake_tpu_host(monkeypatch, chips=4, cores_per_chip=1)
    with pytest.raises(LaunchArgumentError, match="runs the XLA devices of this host only"):
        make_plan(function=print, device="xla", num_nodes=2)
