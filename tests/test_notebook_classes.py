"""A class defined in the notebook and returned by the ranks comes back as the notebook's class, under fork (the
default) as under spawn: ``isinstance`` and ``==`` hold. In a real kernel (nbclient), and in this process with a
class put in ``__main__`` as a notebook's cell does."""

import dataclasses
import sys

import psutil
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from notebook_launcher import notebook_launcher

CELL = '''\
from dataclasses import dataclass
from notebook_launcher import notebook_launcher

@dataclass
class Metrics:
    loss: float
    steps: int

class Plain:
    def __init__(self, value):
        self.value = value

def train():
    import torch.distributed as dist
    return {"metrics": Metrics(0.25, 3), "plain": Plain(dist.get_rank()), "kind": Metrics}

got = notebook_launcher(train, num_processes=2, start_method=START_METHOD, display="text")
print("checks", isinstance(got["metrics"], Metrics), got["metrics"] == Metrics(0.25, 3),
      type(got["plain"]) is Plain, got["kind"] is Metrics)
'''


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.kernel
def test_a_dataclass_of_the_notebook_comes_back_as_the_notebooks_class(tmp_path, start_method):
    from nbclient import NotebookClient

    notebook = new_notebook(cells=[new_code_cell(f"START_METHOD = {start_method!r}"), new_code_cell(CELL)],
                            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                     "language": "python"}})
    client = NotebookClient(notebook, timeout=90, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except Exception as error:  # what the cell printed before it failed
        pytest.fail(f"{type(error).__name__}: {error}\noutputs so far: {notebook.cells[1].get('outputs')}")
    stdout = "".join(o.text for o in notebook.cells[1].outputs if o.output_type == "stream" and o.name == "stdout")
    assert "checks True True True True" in stdout, stdout


@dataclasses.dataclass
class Metrics:
    loss: float
    steps: int


def returns_metrics_and_a_class_made_in_the_rank():
    main = sys.modules["__main__"]
    made_here = dataclasses.make_dataclass("MadeHere", ["x"])
    made_here.__module__ = "__main__"  # in the rank's __main__ only: the kernel has no such class
    main.MadeHere = made_here
    return {"metrics": main.Metrics(0.25, 3), "made_here": made_here(1)}


@pytest.mark.processes
def test_under_fork_a_class_of_the_kernels_main_comes_back_as_that_class(monkeypatch):
    monkeypatch.setattr(Metrics, "__module__", "__main__")
    monkeypatch.setattr(sys.modules["__main__"], "Metrics", Metrics, raising=False)
    got = notebook_launcher(returns_metrics_and_a_class_made_in_the_rank, num_processes=2, device="cpu",
                            start_method="fork")
    assert type(got["metrics"]) is Metrics and got["metrics"] == Metrics(0.25, 3)
    assert got["made_here"].x == 1 and not hasattr(sys.modules["__main__"], "MadeHere")  # by value, as before
    assert psutil.Process().children(recursive=True) == []
