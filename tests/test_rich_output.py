"""What a rank shows the notebook's way reaches the notebook (rank/rich_output.py, display/rich.py).

In a real ipykernel: a rank's display(), rank 0's matplotlib figure (image/png in the cell), a display id updated
50 times (one output, updated), clear_output (rank 0's outputs only, never the panel), tqdm.auto as the rank's
progress, a widget's one-line note, spawn as well as fork; the kernel answers afterwards and logs no "attempted
to send message from fork". Without a kernel: the bounds of both sides.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os

import pytest
from helpers.kernel import (
    KERNEL_NAME,
    _assert_ok,
    _env,
    _panel,
    _panel_lines,
    _rank_outputs,
    kernel_with_log,
    run_cell,
)

from notebook_launcher.display.rich import MAX_CELL_BYTES, MAX_OUTPUTS, RankOutputs
from notebook_launcher.rank import rich_output
from notebook_launcher.schema.events import DISPLAY, Event

DISPLAYS_CELL = '''\
%matplotlib inline
from notebook_launcher import notebook_launcher

def show_things():
    import torch.distributed as dist
    import matplotlib.pyplot as plt
    from IPython.display import HTML, display
    rank = dist.get_rank()
    display(HTML(f"<b>hello from rank {rank}</b>"))
    handle = display(f"count 0 on rank {rank}", display_id=True)
    for i in range(1, 51):
        handle.update(f"count {i} on rank {rank}")
    plt.plot([3, 1, 2])
    plt.title(f"loss of rank {rank}")
    plt.show()
    return rank

notebook_launcher(show_things, num_processes=2, start_method="METHOD")
'''


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.kernel
def test_a_ranks_display_figure_and_updates_reach_the_cell(tmp_path, runs_dir, method):
    pytest.importorskip("matplotlib")
    with kernel_with_log(tmp_path, _env(runs_dir)) as (kc, log_path):
        reply, outputs = run_cell(kc, DISPLAYS_CELL.replace("METHOD", method), timeout=180)
        _assert_ok(reply, outputs)
        shown = _rank_outputs(outputs)
        assert len(shown) == 3, [bundles[0].get("text/plain") for _, bundles in shown]
        (_, html), (_, counts), (_, figure) = shown
        assert html[0]["text/html"] == "<b>hello from rank 0</b>"
        assert html[0]["text/plain"].startswith("[rank 0] <IPython.core.display.HTML")
        # one output, updated in place (thinned to a few updates a second), ending at the last one
        assert counts[0]["text/plain"] == "[rank 0] 'count 0 on rank 0'"
        assert 2 <= len(counts) <= 51 and counts[-1]["text/plain"] == "[rank 0] 'count 50 on rank 0'"
        assert figure[0]["text/plain"] == "[rank 0] <Figure size 640x480 with 1 Axes>"
        assert figure[0]["image/png"].startswith("iVBORw0KGgo")  # a PNG, base64
        panel = _panel(outputs)
        assert "[display] <Figure size 640x480 with 1 Axes>" in _panel_lines(panel, 1)
        assert "[display] 'count 0 on rank 1'" in _panel_lines(panel, 1)
        assert any("displays of other ranks (rank 1: 3)" in note for note in panel["notes"])
        reply, outputs = run_cell(kc, "21 * 2")
        _assert_ok(reply, outputs)
        assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["42"]
    assert "from fork" not in log_path.read_text()


CLEAR_TQDM_WIDGET_CELL = '''\
from notebook_launcher import notebook_launcher

def redraw_and_progress():
    import torch.distributed as dist
    from IPython.display import clear_output, display
    from tqdm.auto import tqdm
    import ipywidgets
    rank = dist.get_rank()
    for i in range(5):
        clear_output(wait=True)
        display(f"frame {i} of rank {rank}")
    for _ in tqdm(range(20), desc="epoch", mininterval=0):
        pass
    ipywidgets.IntSlider(value=3)
    return rank

notebook_launcher(redraw_and_progress, num_processes=2)
'''


@pytest.mark.slow
@pytest.mark.kernel
def test_clear_output_tqdm_auto_and_a_widget_in_a_rank(tmp_path, runs_dir):
    with kernel_with_log(tmp_path, _env(runs_dir)) as (kc, log_path):
        reply, outputs = run_cell(kc, CLEAR_TQDM_WIDGET_CELL, timeout=180)
        _assert_ok(reply, outputs)
        assert not [m for m in outputs if m["msg_type"] == "clear_output"], "the panel is never cleared"
        (display_id, frames), = _rank_outputs(outputs)  # clear + display in a loop: one output, redrawn
        assert [frame["text/plain"] for frame in frames] == [f"[rank 0] 'frame {i} of rank 0'" for i in range(5)]
        panel = _panel(outputs)
        for rank in (0, 1):
            progress = panel["ranks"][rank]["progress"]
            assert progress["step"] == 20 and progress["total"] == 20 and progress["label"] == "epoch"
            assert any("an ipywidget (IntSlider) cannot live in a launched rank" in line
                       for line in _panel_lines(panel, rank))
        reply, outputs = run_cell(kc, "print('still here')")
        _assert_ok(reply, outputs)
    assert "from fork" not in log_path.read_text()


# -- without a kernel: the bounds -------------------------------------------------------------------------------
def _display_event(op="display", text="x", display_id=None, rank=0, **data):
    return Event(rank, 1, 0.0, DISPLAY, {"op": op, "data": {"text/plain": text, **data}, "display_id": display_id})


class _Cell:
    """A stand-in for IPython's display: records what each output shows."""

    def __init__(self):
        self.outputs: list[list] = []

    def publish(self, bundle, metadata, handle):
        if handle is None:
            self.outputs.append([bundle])
            return len(self.outputs) - 1
        self.outputs[handle].append(bundle)
        return handle


def test_rank_outputs_update_in_place_and_clear_only_their_own():
    cell = _Cell()
    outputs = RankOutputs(publish=cell.publish)
    outputs.show(_display_event(text="table 0", display_id="t"))
    for i in range(1, 51):
        outputs.show(_display_event(op="update", text=f"table {i}", display_id="t"))
    assert len(cell.outputs) == 1 and cell.outputs[0][-1]["text/plain"] == "[rank 0] table 50"
    outputs.show(_display_event(text="other"))
    outputs.show(Event(0, 2, 0.0, DISPLAY, {"op": "clear", "wait": False}))
    assert [output[-1]["text/plain"] for output in cell.outputs] == ["", ""]  # blanked, not removed
    outputs.show(_display_event(text="after"))
    assert len(cell.outputs) == 2 and cell.outputs[0][-1]["text/plain"] == "[rank 0] after"
    outputs.show(_display_event(text="of rank 1", rank=1))
    assert len(cell.outputs) == 2 and "rank 1: 1" in outputs.finish()


def test_rank_outputs_are_capped_per_run():
    cell = _Cell()
    outputs = RankOutputs(publish=cell.publish)
    for i in range(MAX_OUTPUTS + 5):
        outputs.show(_display_event(text=f"plot {i}"))
    assert len(cell.outputs) == MAX_OUTPUTS and outputs.left_out == 5
    big = RankOutputs(publish=_Cell().publish)
    image = "A" * (MAX_CELL_BYTES // 4)  # with its text, a little over a quarter: three fit
    for _ in range(4):
        big.show(_display_event(**{"image/png": image}))
    assert big.left_out == 1 and big.held_bytes <= MAX_CELL_BYTES
    assert "not shown in the cell" in big.finish()


def test_a_rank_sends_bounded_bundles_and_thins_updates(monkeypatch):
    sent = []
    displays = rich_output.RankDisplays(lambda kind, data: sent.append(data))
    displays.display({"text/plain": "fig", "image/png": b"\x89PNG" * 10}, {"image/png": {"width": 4}}, None, False)
    assert sent[-1]["data"]["image/png"] == base64.b64encode(b"\x89PNG" * 10).decode() and sent[-1]["metadata"] == {"image/png": {"width": 4}}
    displays.display({"text/plain": "huge", "text/html": "x" * (rich_output.MAX_BUNDLE_BYTES + 1)}, None, None, False)
    assert sent[-1]["data"] == {"text/plain": "huge"} and sent[-1]["omitted"] == ["text/html"]
    count = len(sent)
    for i in range(100):  # faster than UPDATE_EVERY_S: only the newest goes, once held ones are flushed
        displays.display({"text/plain": f"row {i}"}, None, "t", True)
    displays.flush()
    updates = sent[count:]
    assert len(updates) < 10 and updates[-1]["data"]["text/plain"] == "row 99"
    monkeypatch.setattr(rich_output, "MAX_RANK_DISPLAYS", len(sent))
    displays.display({"text/plain": "one too many"}, None, None, False)
    assert displays.left_out == 1 and "1 left out" in displays.summary()


TRAINER_CELL = '''\
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from notebook_launcher import notebook_launcher

def train(output_dir):
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32, bos_token_id=0,
                        eos_token_id=0)
    model = GPT2LMHeadModel(config)

    class RandomTokens(torch.utils.data.Dataset):
        ids = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(1))

        def __len__(self):
            return 64

        def __getitem__(self, index):
            return {"input_ids": self.ids[index], "labels": self.ids[index]}

    args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=4, num_train_epochs=1,
                             report_to=[], save_strategy="no", use_cpu=True, logging_steps=1)
    return Trainer(model=model, args=args, train_dataset=RandomTokens()).train().global_step

steps = notebook_launcher(train, args=("trainer",), num_processes=2, device="cpu")
'''


@pytest.mark.slow
@pytest.mark.kernel
def test_trainers_notebook_callback_shows_its_loss_table_in_the_cell(tmp_path, runs_dir):
    """Trainer in a notebook picks NotebookProgressCallback (a display, then updates of its display id): its
    progress bar and "Training Loss" table are one output of the cell, updated to the last step, and saved."""
    pytest.importorskip("transformers")
    import nbformat
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    notebook = new_notebook(cells=[new_code_cell(TRAINER_CELL), new_code_cell("print('steps', steps)")],
                            metadata={"kernelspec": {"name": KERNEL_NAME, "display_name": "Python 3",
                                                     "language": "python"}})
    env = {"HF_HUB_OFFLINE": "1", "NOTEBOOK_LAUNCHER_RUNS_DIR": str(runs_dir)}
    with _environ(env):
        NotebookClient(notebook, timeout=240, kernel_name=KERNEL_NAME,
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
    path = tmp_path / "trainer.ipynb"
    nbformat.write(notebook, str(path))
    outputs = nbformat.read(str(path), as_version=4).cells[0].outputs
    tables = [output for output in outputs if output.output_type == "display_data"
              and "Training Loss" in output.data.get("text/html", "")]
    assert len(tables) == 1, [output.data.get("text/plain") for output in outputs if "data" in output]
    table = tables[0].data["text/html"]
    assert table.count("<tr>") == 8 and "<td>8</td>" in table  # a row per step (64 samples, 2 ranks of 4)
    assert "8/8" in table  # its progress bar, at the end
    assert tables[0].data["text/plain"].startswith("[rank 0] ")
    assert "steps 8" in "".join(output.get("text", "") for output in notebook.cells[1].outputs)


@contextlib.contextmanager
def _environ(values: dict):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _sent_size(payload: dict) -> int:
    sizes = [len(v) if isinstance(v, str) else len(json.dumps(v)) for part in ("data", "metadata")
             for v in (payload.get(part) or {}).values()]
    return sum(sizes)


def test_a_ranks_display_bound_counts_widget_bundles_and_metadata_by_their_size():
    sent = []
    displays = rich_output.RankDisplays(lambda kind, data: sent.append(data))
    view = {"model_id": "m", "version_major": 2, "version_minor": 0}
    html = "<b>" + "x" * (int(3.9 * 2**20) - 3)  # 3.9 MB beside a widget's view, 60 times: past the rank's 64 MB
    for i in range(60):
        displays.display({"text/plain": f"widget {i}", "text/html": html, rich_output.WIDGET_VIEW: view}, None,
                         None, False)
    for i in range(6):  # a small bundle with 20 MB of metadata each
        displays.display({"text/plain": f"meta {i}", "image/png": b"png"}, {"image/png": {"x": "y" * 20 * 2**20}},
                         None, False)
    total = sum(_sent_size(payload) for payload in sent)
    assert total <= rich_output.MAX_RANK_BYTES and displays.sent_bytes == total
    assert all(rich_output.WIDGET_VIEW not in payload["data"] for payload in sent)
    assert all(len(json.dumps(payload["metadata"])) < 2**20 for payload in sent[-6:])
    assert displays.cut >= 6 + 60 - rich_output.MAX_RANK_BYTES // len(html)
    assert "text only" in displays.summary()
