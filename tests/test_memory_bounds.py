"""The kernel's memory per run is bounded in bytes, whatever the ranks send, and the run log keeps everything.

Real launches: a rank writing hundreds of MB without a newline, in a fresh Python process acting as the kernel
(its RSS after the run, and what the Run keeps, counted by the code and checked against a real sum); runs kept
in memory let their events go, oldest first; in a real ipykernel, displays with 20 MB of metadata and big
bundles that carry a widget's view: the saved cell stays under its cap and the kernel under its bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from sys import getsizeof

import psutil
import pytest
from helpers.kernel import PANEL_MIME, _assert_ok, _panel, _stream, run_cell, running_kernel

from notebook_launcher import last_run, notebook_launcher, recent_runs, runs
from notebook_launcher.display.budget import saved_size
from notebook_launcher.display.rich import MAX_CELL_BYTES, RankOutputs
from notebook_launcher.launchers import intake
from notebook_launcher.rank import rich_output
from notebook_launcher.schema.events import DISPLAY, Event

MB = 2**20
FLOOD_MB = 512  # written by rank 1 without a newline (1 GB takes twice as long and shows the same)
RSS_MARGIN = 160 * MB  # the allocator's slack above what the Run keeps (measured: about 50 MB)
STORY = 64 * 1024  # the run's own events (status, exits, results), kept past the bound

FLOOD_KERNEL = textwrap.dedent('''\
    import gc, json, os, sys
    from sys import getsizeof
    import psutil
    from notebook_launcher import last_run, notebook_launcher

    def flood(total):
        import os
        import torch.distributed as dist
        if dist.get_rank() == 1:
            block = b"x" * (1 << 20)
            for _ in range(total >> 20):
                os.write(1, block)
        dist.barrier()
        return 7

    me = psutil.Process()
    notebook_launcher(flood, args=(0,), num_processes=2, device="cpu", display="text")  # (torch, gloo: warm)
    gc.collect()
    before = me.memory_info().rss
    result = notebook_launcher(flood, args=(int(sys.argv[1]),), num_processes=2, device="cpu", display="text")
    gc.collect()
    after = me.memory_info().rss
    run = last_run()
    texts = [event.data["text"] for event in run.events if event.kind == "stream"]
    with open(sys.argv[2], "w") as out:
        json.dump({"before": before, "after": after, "result": result, "kept_bytes": run.events.bytes,
                   "kept_events": len(run.events), "texts_bytes": sum(map(getsizeof, texts)),
                   "texts_chars": sum(map(len, texts)), "dropped": run.events_dropped,
                   "dropped_bytes": run.events_dropped_bytes,
                   "log_bytes": os.path.getsize(os.path.join(run.run_dir, "events.jsonl"))}, out)
''')


@pytest.mark.processes
def test_a_rank_writing_hundreds_of_mb_without_a_newline_leaves_the_kernel_bounded(tmp_path):
    """A fresh process is the kernel: its RSS after the run is its RSS before, plus at most the bound and the
    allocator's slack (before the bound: the whole flood, +1.1 GB after 1 GB)."""
    script, report = tmp_path / "kernel.py", tmp_path / "report.json"
    script.write_text(FLOOD_KERNEL)
    process = subprocess.Popen([sys.executable, str(script), str(FLOOD_MB * MB), str(report)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    assert process.returncode == 0, stderr.decode(errors="replace")[-3000:]
    measured = json.loads(report.read_text())
    assert measured["result"] == 7
    # what the Run keeps: within the bound, and the count is true (the texts it holds, and little besides)
    assert measured["kept_bytes"] <= intake.MAX_BYTES_IN_MEMORY + STORY
    assert measured["texts_bytes"] <= measured["kept_bytes"] <= measured["texts_bytes"] + 4000 * measured["kept_events"]
    assert measured["texts_chars"] >= intake.MAX_BYTES_IN_MEMORY // 2  # it keeps the run's beginning, not nothing
    assert measured["dropped"] > 0 and measured["dropped_bytes"] >= (FLOOD_MB * MB - intake.MAX_BYTES_IN_MEMORY)
    assert measured["log_bytes"] >= FLOOD_MB * MB  # the run log has every byte
    grown = measured["after"] - measured["before"]
    assert grown <= intake.MAX_BYTES_IN_MEMORY + RSS_MARGIN, f"the kernel kept {grown / MB:.0f} MB after the run"


def prints_lines(count: int, width: int):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        for index in range(count):
            print(f"{index:08d} " + "y" * width)
    return dist.get_rank() + 100


@pytest.mark.processes
def test_output_past_the_bound_is_noted_once_and_earlier_runs_let_their_events_go(monkeypatch, capsys):
    monkeypatch.setattr(intake, "MAX_BYTES_IN_MEMORY", MB)
    monkeypatch.setattr(runs, "MAX_RECENT_BYTES", 2 * MB)
    launched = []
    for _ in range(4):
        assert notebook_launcher(prints_lines, args=(3000, 1000), num_processes=2, device="cpu",
                                 display="text") == 100
        launched.append(last_run())
        lines = [line for line in capsys.readouterr().out.splitlines() if "past the in-memory bound" in line]
        assert len(lines) == 1, lines  # once a run
        assert f"in the run log only: inspect_run({launched[-1].run_id!r})" in lines[0]
        assert " MB of output (" in lines[0] and "bound of 1 MB a run" in lines[0]
    newest = launched[-1]
    assert 0.5 * MB < newest.events.bytes <= MB + STORY and newest.events_dropped > 0
    assert newest.output(rank=1)[0].startswith("00000000 ")  # it keeps the run's beginning
    assert [run.run_id for run in recent_runs()[-4:]] == [run.run_id for run in launched]
    earlier = launched[:-1]
    assert sum(run.events.bytes for run in earlier) <= 2 * MB
    assert all(run.events.bytes <= MB + STORY for run in launched)
    oldest = earlier[0]
    assert len(oldest.events) == 0 and oldest.events.bytes == 0 and oldest.events_dropped >= 3000
    assert oldest.status == "finished" and oldest.results == {0: 100, 1: 101} and oldest.summary()["exit_codes"] == {0: 0, 1: 0}
    with open(os.path.join(oldest.run_dir, "events.jsonl")) as log:  # the run log still has every line
        texts = [record["data"].get("text", "") for record in map(json.loads, log) if record["kind"] == "stream"]
    assert sum(text.startswith("0000") for text in texts) == 3000


def test_a_runs_count_of_what_it_keeps_is_the_real_size_of_each_kind():
    """Lines, log records and displays (their metadata, a widget's view) counted by what they hold."""
    from notebook_launcher.schema.lines import EventList, LogRecords, StreamLines, retained_bytes

    kept = EventList()
    texts = ["é" * 1000, "plain", "x" * 100_000]
    kept.extend_lines([StreamLines(0, 1, 1.0, "stdout", list(texts))])
    assert sum(map(getsizeof, texts)) < kept.bytes < sum(map(getsizeof, texts)) + 500
    frame = (3, 2.0, "INFO", 20, "train", "m" * 50_000, "f.py", 3, "fn", 1.0, 0)
    before = kept.bytes
    kept.extend_lines([LogRecords(1, 1, [frame, frame])])
    assert 2 * retained_bytes(frame) < kept.bytes - before < 2 * retained_bytes(frame) + 500
    view = {"model_id": "w" * 3_000_000, "version_major": 2, "version_minor": 0}
    metadata = {"image/png": {"note": "m" * 5_000_000}}
    before = kept.bytes
    kept.append(Event(0, 5, 1.0, DISPLAY, {"op": "display", "data": {"text/plain": "x", WIDGET_VIEW: view},
                                            "metadata": metadata}))
    assert kept.bytes - before > 8_000_000  # the view and the metadata, each by its size


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def test_the_cells_outputs_count_metadata_and_widget_views():
    shown = []
    outputs = RankOutputs(publish=lambda bundle, metadata, handle: shown.append((bundle, metadata)) or len(shown))
    for index in range(6):  # 20 MB of metadata each: none fits the cell's 20 MB
        outputs.show(Event(0, index, 0.0, DISPLAY, {"op": "display", "data": {"text/plain": "m", "image/png": "iVBO"},
                                                    "metadata": {"image/png": {"note": "m" * 20 * MB}}}))
    for index in range(10):  # a widget's view of 3.9 MB each: five fit
        outputs.show(Event(0, 10 + index, 0.0, DISPLAY, {"op": "display", "data": {
            "text/plain": "w", WIDGET_VIEW: {"model_id": "w" * 3_900_000}}}))
    saved = sum(saved_size(bundle, metadata) for bundle, metadata in shown)
    assert saved <= MAX_CELL_BYTES and outputs.held_bytes <= MAX_CELL_BYTES
    assert len(shown) == 5 and outputs.left_out == 11
    assert "11 display(s)" in outputs.finish()


BIG_DISPLAYS_CELL = '''\
from notebook_launcher import notebook_launcher

def shows_big(count, size):
    import torch.distributed as dist
    from IPython.display import display
    for index in range(count):
        display({"text/plain": f"big {index}", "text/html": "<p>" + "h" * size + "</p>",
                 "application/vnd.jupyter.widget-view+json": {"model_id": f"m{index}", "version_major": 2,
                                                               "version_minor": 0}}, raw=True)
    if dist.get_rank() == 0:
        for index in range(6):
            display({"text/plain": f"meta {index}", "image/png": "iVBORw0KGgo="}, raw=True,
                    metadata={"image/png": {"note": "m" * 20 * 2**20}})
    return 1

notebook_launcher(shows_big, args=(30, 3_900_000), num_processes=2)
'''

RUN_REPORT_CELL = '''\
import json, os
from notebook_launcher import last_run
run = last_run()
log = os.path.join(run.run_dir, "events.jsonl")
displays = sum(1 for line in open(log, encoding="utf-8") if json.loads(line).get("kind") == "display")
print(json.dumps({"kept": run.events.bytes, "dropped": run.events_dropped, "log": os.path.getsize(log),
                  "displays": displays}))
'''


@pytest.mark.processes
@pytest.mark.kernel
def test_big_displays_metadata_and_widget_views_stay_within_the_cell_and_the_kernels_bounds(tmp_path, runs_dir):
    """Each rank displays 30 bundles of 3.9 MB carrying a widget's view, rank 0 six with 20 MB of metadata: the
    cell's outputs stay under 20 MB, the kernel keeps at most its bound of them, the run log has them all."""
    with running_kernel(tmp_path) as (_, kc, kernel):
        reply, outputs = run_cell(kc, "import notebook_launcher, torch, gc", timeout=120)
        _assert_ok(reply, outputs)
        before = kernel.memory_info().rss
        reply, outputs = run_cell(kc, BIG_DISPLAYS_CELL, timeout=240)
        _assert_ok(reply, outputs)
        newest: dict = {}
        for msg in outputs:
            content = msg["content"]
            if msg["msg_type"] in ("display_data", "update_display_data") and PANEL_MIME not in content["data"]:
                newest[content.get("transient", {}).get("display_id")] = (content["data"], content["metadata"])
        saved = sum(saved_size(data, metadata) for data, metadata in newest.values())
        assert saved <= MAX_CELL_BYTES, f"the cell would save {saved / MB:.0f} MB"
        notes = " ".join(_panel(outputs)["notes"])
        assert "not shown in the cell" in notes and "past the in-memory bound" in notes
        reply, outputs = run_cell(kc, "gc.collect()\n" + RUN_REPORT_CELL)
        _assert_ok(reply, outputs)
        report = json.loads(_stream(outputs).strip().splitlines()[-1])
        grown = kernel.memory_info().rss - before
        assert report["kept"] <= intake.MAX_BYTES_IN_MEMORY + STORY and report["dropped"] > 0
        # every display is in the run log, each rank's within its own bound (past it a display goes as its text)
        assert report["displays"] == 2 * 30 + 6
        assert 64 * MB < report["log"] <= 2 * (rich_output.MAX_RANK_BYTES + 30 * rich_output.MAX_TEXT) + 2 * MB
        assert grown <= intake.MAX_BYTES_IN_MEMORY + RSS_MARGIN, f"the kernel grew by {grown / MB:.0f} MB"
    assert psutil.Process().children(recursive=True) == []
