"""%%accelerate in a real Jupyter kernel (nbclient): cells on every rank, names back from rank 0."""

import os

import nbformat
import psutil
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.slow
PANEL_MIME = "application/vnd.notebook-launcher.run.v1+json"

CELLS = {
    "load": "%load_ext notebook_launcher",
    "setup": "import torch\nOFFSET = 5.0\n\ndef helper(x):\n    return x + OFFSET",
    "train": (
        "%%accelerate -n 2\n"
        "import torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "torch.manual_seed(0)\n"
        "model = DDP(torch.nn.Linear(4, 1))\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "history = []\n"
        "for step in range(5):\n"
        "    loss = model(torch.ones(8, 4)).pow(2).mean()\n"
        "    optimizer.zero_grad(); loss.backward(); optimizer.step()\n"
        "    history.append(round(loss.item(), 6))\n"
        "print('rank', dist.get_rank(), 'done')\n"
        "model = model.module\n"
        "lock = __import__('threading').Lock()"
    ),
    "use": "print('losses', len(history), history[-1] < history[0], type(model).__name__, 'lock' in dir())",
    "spawn": "%%accelerate -n 2 --start-method spawn --return shipped\nshipped = helper(torch.ones(2)) * 2\nother = 1",
    "shipped": "print('shipped', shipped.tolist(), 'other' in dir())",
    "unpicklable": "import threading\nnotebook_lock = threading.Lock()",
    "spawn_lock": "%%accelerate -n 2 --start-method spawn\nprint(notebook_lock)",
    "debug": ("%%accelerate -n 2 --debug\nimport torch.distributed as dist\nrank = dist.get_rank()\n"
              "from notebook_launcher import ops\n"
              "ops.broadcast(torch.ones(1, 5) if rank == 0 else torch.ones(1, 2, 5))"),
    "failure": ("%%accelerate -n 2 --no-return\nimport torch.distributed as dist\nx = 1\n"
                "if dist.get_rank() == 1:\n    raise ValueError('rank 1 broke')\n"),
    "text": ("%%accelerate -n 2 --text\nimport torch.distributed as dist\n"
             "print(f'plain line from {dist.get_rank()}')\nanswer = 42"),
    "help": "print(get_ipython().find_cell_magic('accelerate').__doc__)",
    "doctor": "%accelerate_doctor -n 2",
    "default_count": ("%%accelerate --text --device cpu --no-return\nimport torch.distributed as dist\n"
                      "print('world size', dist.get_world_size())"),
    "children": "import psutil; print('children', len(psutil.Process().children(recursive=True)))",
}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("magic")
    notebook = new_notebook(cells=[new_code_cell(source) for source in CELLS.values()])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    client = NotebookClient(notebook, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(folder)}})
    env_before = os.environ.get("NOTEBOOK_LAUNCHER_RUNS_DIR")
    os.environ.setdefault("NOTEBOOK_LAUNCHER_RUNS_DIR", str(folder / "runs"))
    try:
        client.execute()
    finally:
        if env_before is None:
            os.environ.pop("NOTEBOOK_LAUNCHER_RUNS_DIR", None)
    nbformat.write(notebook, str(folder / "magic.ipynb"))
    return dict(zip(CELLS, notebook.cells))


def text(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif output["output_type"] == "display_data":  # the run panel's text fallback
            parts.append(output["data"].get("text/plain", "") + "\n")
        elif output["output_type"] == "error":
            parts.append("\n".join(output["traceback"]))
            parts.append(f"{output['ename']}: {output['evalue']}")
    return "".join(parts)


@pytest.mark.kernel
def test_a_cell_trains_on_two_ranks_and_the_notebook_uses_model_and_history(executed):
    out = text(executed["train"])
    assert "[rank 0] rank 0 done" in out and "[rank 1] rank 1 done" in out
    assert "notebook_launcher: back from rank 0: model, optimizer, history, step, loss;" in out
    assert "skipped: lock (cannot be pickled" in out
    assert "losses 5 True Linear False" in text(executed["use"])


@pytest.mark.kernel
def test_spawn_ships_a_notebook_function_and_a_tensor_and_return_narrows(executed):
    assert "start method spawn" in text(executed["spawn"])
    assert "back from rank 0: shipped" in text(executed["spawn"])
    assert "shipped [12.0, 12.0] False" in text(executed["shipped"])


@pytest.mark.kernel
def test_an_unpicklable_name_under_spawn_is_named(executed):
    out = text(executed["spawn_lock"])
    assert "the cell uses `notebook_lock` (a lock), which cannot be sent to spawned workers" in out
    assert "--start-method fork" in out


@pytest.mark.kernel
def test_debug_mismatch_shows_the_exception_with_the_cells_line(executed):
    out = text(executed["debug"])
    assert "DistributedOperationException: Cannot apply desired operation due to shape mismatches" in out
    assert "Operation: `notebook_launcher.ops.broadcast`" in out
    assert "  - Process 1: [1, 2, 5]" in out
    assert "cell In[9], line 5, in <module>" in out  # the ops.broadcast line, as numbered in the cell


@pytest.mark.kernel
def test_a_failing_rank_is_reported_with_the_cells_line_number(executed):
    out = text(executed["failure"])
    assert "Rank 1 failed first: ValueError: rank 1 broke" in out
    assert "cell In[10], line 5, in <module>" in out
    assert "raise ValueError('rank 1 broke')" in out
    assert "notebook_launcher/magic.py" not in out.split("Other ranks:")[0].split("Rank 1 failed first")[1]


@pytest.mark.kernel
def test_text_prints_rank_prefixed_lines_and_no_panel(executed):
    outputs = executed["text"]["outputs"]
    assert outputs and {output["output_type"] for output in outputs} == {"stream"}
    stdout = "".join(output["text"] for output in outputs if output["name"] == "stdout")
    lines = stdout.splitlines()
    assert lines[0].startswith("notebook_launcher: 2 processes on cpu (gloo), start method ")
    assert sorted(line for line in lines if line.startswith("[rank ")) == [
        "[rank 0] plain line from 0", "[rank 1] plain line from 1"]
    assert lines[-1] == "notebook_launcher: back from rank 0: answer"
    help_text = " ".join(text(executed["help"]).split())  # argparse wraps the option's help
    assert "--text plain rank-prefixed lines ([rank 0] ...) instead of the live run panel" in help_text


@pytest.mark.kernel
def test_without_text_the_cell_shows_the_live_panel(executed):
    panels = [output for output in executed["train"]["outputs"]
              if output["output_type"] == "display_data" and PANEL_MIME in output["data"]]
    assert len(panels) == 1 and panels[0]["data"][PANEL_MIME]["status"] == "finished"
    assert "[rank 0] rank 0 done" in panels[0]["data"]["text/plain"]


@pytest.mark.kernel
def test_without_num_processes_the_cell_runs_on_two_cpu_ranks_as_the_keyword_says(executed):
    lines = text(executed["default_count"]).splitlines()
    assert lines[0].startswith("notebook_launcher: 2 processes on cpu (gloo)")
    assert sorted(line for line in lines if "world size" in line) == ["[rank 0] world size 2", "[rank 1] world size 2"]


@pytest.mark.kernel
def test_help_lists_the_options(executed):
    out = text(executed["help"])
    for option in ("--num-processes", "--debug", "--mixed-precision", "--start-method", "--device", "--timeout",
                   "--port", "--memory-limit", "--text", "--return", "--no-return"):
        assert option in out


@pytest.mark.processes
@pytest.mark.kernel
def test_no_worker_is_left_in_the_kernel(executed):
    assert "children 0" in text(executed["children"])
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.processes
def test_the_magic_notebook_runs_end_to_end(tmp_path, repo_root):
    import shutil
    import subprocess
    import sys

    notebook = tmp_path / "accelerate_magic.ipynb"
    shutil.copy(os.path.join(repo_root, "notebooks", "accelerate_magic.ipynb"), notebook)
    completed = subprocess.run([sys.executable, os.path.join(repo_root, "scripts", "run_notebook.py"),
                                str(notebook)], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert "notebook_launcher: back from rank 0: " in completed.stdout and "accuracy 0." in completed.stdout


@pytest.mark.kernel
def test_accelerate_doctor_line_magic_shows_the_checks(executed):
    outputs = executed["doctor"]["outputs"]
    shown = "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "Linux kernel" in shown and "CUDA in this kernel" in shown and "[  ok   ]" in shown
