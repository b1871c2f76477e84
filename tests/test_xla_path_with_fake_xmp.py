"""The TPU path through torch_xla's multiprocessing, with a fake ``xmp`` (this machine has no TPU)."""

import sys
import types

import pytest

from notebook_launcher import last_run, notebook_launcher


class FakeXmp(types.ModuleType):
    """Stands in for torch_xla.distributed.xla_multiprocessing: runs each index in turn, in this process."""

    def __init__(self):
        super().__init__("torch_xla.distributed.xla_multiprocessing")
        self.calls = []

    def spawn(self, fn, args=(), nprocs=None, start_method="spawn"):
        self.calls.append({"nprocs": nprocs, "start_method": start_method})
        for index in range(nprocs):
            fn(index, *args)


@pytest.fixture
def fake_xmp(monkeypatch):
    xmp = FakeXmp()
    torch_xla = types.ModuleType("torch_xla")
    distributed = types.ModuleType("torch_xla.distributed")
    distributed.xla_multiprocessing = xmp
    torch_xla.distributed = distributed
    monkeypatch.setitem(sys.modules, "torch_xla", torch_xla)
    monkeypatch.setitem(sys.modules, "torch_xla.distributed", distributed)
    monkeypatch.setitem(sys.modules, "torch_xla.distributed.xla_multiprocessing", xmp)
    return xmp


def test_xla_path_with_fake_xmp_returns_rank0_result(fake_xmp, capsys):
    def train(scale):
        import torch

        return torch.arange(3) * scale

    result = notebook_launcher(train, args=(2,), num_processes=4, device="xla")
    assert result.tolist() == [0, 2, 4]
    assert fake_xmp.calls == [{"nprocs": 4, "start_method": "fork"}]
    assert last_run().device == "xla" and last_run().backend == "xla"
    assert "4 processes on xla (xla)" in capsys.readouterr().out


def test_xla_path_with_fake_xmp_defaults_to_eight_cores_like_accelerate(fake_xmp):
    notebook_launcher(lambda: None, device="xla")
    assert fake_xmp.calls[0]["nprocs"] == 8
