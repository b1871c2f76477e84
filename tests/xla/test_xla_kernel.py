"""device="xla" from a real Jupyter kernel (nbclient), with a training function defined in the notebook: the
live panel with a column per ordinal, and the value back, under fork and under spawn (``make test-xla``)."""

from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.kernel

PANEL_MIME = "application/vnd.notebook-launcher.run.v1+json"

DEFINE = '''\
import os, time
os.environ.update({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"})
import torch
from notebook_launcher import notebook_launcher

def train(steps):
    import torch_xla, torch_xla.core.xla_model as xm, torch_xla.runtime as xr
    rank = xr.global_ordinal()
    for step in range(steps):
        print(f"step {step} on ordinal {rank}")
    value = (torch.ones(2) * (rank + 1)).to(torch_xla.device())
    torch_xla.sync()
    time.sleep(1.5 * rank)
    total = xm.all_reduce("sum", value)
    torch_xla.sync()
    return total
'''


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_notebook_function_runs_on_every_ordinal_with_the_panel(tmp_path, start_method):
    launch = f'notebook_launcher(train, args=(3,), device="xla", start_method="{start_method}").tolist()'
    notebook = new_notebook(cells=[new_code_cell(DEFINE), new_code_cell(launch)],
                            metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                     "language": "python"}})
    client = NotebookClient(notebook, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except Exception as error:  # show what the cell printed before it failed
        pytest.fail(f"{type(error).__name__}: {error}\noutputs: {notebook.cells[1].get('outputs')}")
    outputs = notebook.cells[1].outputs
    assert [o.output_type for o in outputs] == ["display_data", "execute_result"], outputs
    assert outputs[1].data["text/plain"] == "[3.0, 3.0]"
    panel = outputs[0].data[PANEL_MIME]
    assert panel["status"] == "finished" and panel["world_size"] == 2 and panel["device"] == "xla"
    assert panel["notes"][0].startswith("2 ordinals (PJRT CPU: 2 devices as threads of one process"), panel["notes"]
    for rank in (0, 1):
        column = panel["ranks"][rank]
        assert column["rank"] == rank and column["status"] == "finished"
        texts = [line["text"] for line in column["lines"] if line["kind"] == "stdout"]
        assert texts == [f"step {step} on ordinal {rank}" for step in range(3)], column["lines"]
    nbformat.validate(notebook)
