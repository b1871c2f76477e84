"""The panel at many ranks, in-process: deltas rebuild the state exactly, the saved bundle keeps its budget, and
who gets what (listening panels: deltas; everyone else: the MIME output as before). Over a real kernel's comm:
test_panel_comm.py."""

from __future__ import annotations

import json
import random
import time

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from notebook_launcher.display import panel as panel_module
from notebook_launcher.display.budget import SAVED_BYTES, saved_size
from notebook_launcher.display.comm import PanelChannel, unpack
from notebook_launcher.display.delta import DeltaTracker, apply_delta
from notebook_launcher.display.panel import PanelDisplay
from notebook_launcher.display.state import MIME_TYPE, RunState
from notebook_launcher.schema.events import (
    BATCH_SIZE,
    EXIT,
    FAILURE,
    HANG_NOTICE,
    LAUNCHER,
    LOG,
    OOM_RETRY,
    PROGRESS,
    RESTART,
    SHAPE_MISMATCH,
    STATUS,
    STREAM,
    TRIGGER,
    Event,
)


def _random_event(rng: random.Random, seq: int, ranks: list[int]) -> Event:
    rank = rng.choice(ranks)
    kind = rng.choices([STREAM, LOG, PROGRESS, STATUS, FAILURE, EXIT, LAUNCHER, RESTART, HANG_NOTICE,
                        SHAPE_MISMATCH, OOM_RETRY, BATCH_SIZE, TRIGGER],
                       weights=[40, 8, 12, 6, 1, 2, 2, 1, 2, 1, 1, 1, 1])[0]
    data: dict = {}
    if kind == STREAM:
        data = {"stream": rng.choice(["stdout", "stderr"]), "text": rng.choice(
            [f"line {seq} é", "", f"epoch: {rng.randint(0, 100)}%|##  | {rng.randint(0, 9)}/9 [00:01<00:01]"])}
    elif kind == LOG:
        data = {"level": rng.choice(["INFO", "WARNING"]), "logger": "train", "message": f"log {seq}"}
    elif kind == PROGRESS:
        data = {"step": rng.randint(0, 30), "total": rng.choice([30, None]), "metrics": {"loss": rng.random()}}
    elif kind == STATUS:
        data = {"state": rng.choice(["starting", "running", "finished", "failed"]), "pid": 100 + rank,
                "host": rng.choice([None, "node-1"]), "exit_code": rng.choice([0, 1])}
    elif kind == FAILURE:
        data = {"type": "ValueError", "message": "bad", "traceback": "Traceback ...\nValueError: bad\n"}
    elif kind == EXIT:
        data = {"exit_code": rng.choice([0, 1, -9]), "stopped_by_launcher": rng.random() < 0.5}
    elif kind in (LAUNCHER, RESTART):
        data = {"text": f"launcher says {seq}", "attempt": rng.randint(2, 3)}
    elif kind == HANG_NOTICE:
        data = rng.choice([{"state": "open", "quiet_s": 3.0, "text": "possible hang",
                            "ranks": {str(r): {"state": rng.choice(["waiting", "busy"]), "text": "at x"}
                                      for r in ranks}, "stacks": {str(rank): "stack"}},
                           {"state": "cleared", "quiet_s": 4.0, "text": "progress resumed"}])
    elif kind == SHAPE_MISMATCH:
        data = {"operation": "all_gather", "shapes": [[4], [2]], "message": "shapes differ"}
    elif kind == OOM_RETRY:
        data = {"ranks": [rank], "batch_size": 64, "new_batch_size": 32, "error": "out of memory"}
    elif kind == BATCH_SIZE:
        data = {"batch_size": rng.choice([16, 32])}
    elif kind == TRIGGER:
        data = {"call_site": "train.py:3"}
    return Event(rank=rank, seq=seq, time=time.monotonic(), kind=kind, data=data)


def _without_seq(state: dict) -> dict:
    return {key: value for key, value in state.items() if key != "seq"}


@pytest.mark.parametrize("seed", range(60))
def test_deltas_applied_in_order_rebuild_exactly_the_state_a_full_update_carries(seed):
    rng = random.Random(seed)
    ranks = list(range(rng.randint(1, 6)))
    state = RunState("id", "/tmp/run", "cpu", "gloo", "fork", len(ranks), len(ranks), ranks,
                     lines_per_rank=rng.choice([3, 10, 200]))
    tracker = DeltaTracker(state)
    seen = {**tracker.reset(), "seq": tracker.seq}
    for seq in range(1, rng.randint(50, 400)):
        state.observe(_random_event(rng, seq, ranks + [len(ranks)]))  # a rank beyond the plan appears too
        if rng.random() < 0.02:
            state.set_ranks(rng.sample(range(8), rng.randint(1, 5)))
            ranks = sorted(state.ranks)
        if rng.random() < 0.1:
            state.note(f"note {seq}")
        if rng.random() < 0.25:  # bursts between deltas, longer than a rank keeps
            delta = json.loads(json.dumps(tracker.delta()))  # what the wire carries
            assert delta["base"] == seen["seq"]
            seen = apply_delta(seen, delta, tracker.caps)
            expected = state.to_json()
            expected["elapsed"] = seen["elapsed"]
            assert _without_seq(seen) == expected
    state.finish(rng.choice(["finished", "failed", "hung"]), stuck_ranks=ranks[:1])
    seen = apply_delta(seen, json.loads(json.dumps(tracker.delta())), tracker.caps)
    assert _without_seq(seen) == {**state.to_json(), "elapsed": seen["elapsed"]}


def _big_run(num_ranks: int, lines: int, text_length: int) -> RunState:
    state = RunState("id", "/tmp/run", "cpu", "gloo", "fork", num_ranks, num_ranks, list(range(num_ranks)))
    seq = 0
    for i in range(lines):
        for rank in range(num_ranks):
            seq += 1
            state.observe(Event(rank=rank, seq=seq, time=time.monotonic(), kind=STREAM,
                                data={"stream": "stdout", "text": f"rank {rank} line {i} <&> " + "x" * text_length}))
            if i % 2 == 0:
                state.observe(Event(rank=rank, seq=seq, time=time.monotonic(), kind=PROGRESS,
                                    data={"step": i, "total": lines, "metrics": {"loss": 1 / (i + 1)}}))
    return state


def test_the_saved_bundle_of_64_ranks_holds_its_budget_and_keeps_each_ranks_newest_lines_in_order(tmp_path):
    state = _big_run(64, 250, 60)
    state.finish("failed", failure={"kind": "failure", "rank": 3, "type": "ValueError", "traceback": "T" * 200_000,
                                    "message": "M" * 200_000, "stacks": {str(r): "S" * 5000 for r in range(64)}})
    panel = PanelDisplay(state, channel=None)
    bundle = panel.bundle()
    full = state.to_json()
    assert len(json.dumps(full)) > 5 * SAVED_BYTES  # uncut, it would be several megabytes
    # as written in a real .ipynb (nbformat: indented JSON, strings as lists of lines)
    notebook = new_notebook(cells=[new_code_cell("launch()", outputs=[
        new_output("display_data", data=bundle, metadata={})])])
    path = tmp_path / "run.ipynb"
    nbformat.write(notebook, str(path))
    empty = tmp_path / "empty.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("launch()")]), str(empty))
    assert path.stat().st_size - empty.stat().st_size <= SAVED_BYTES
    assert saved_size(bundle) <= SAVED_BYTES
    payload = bundle[MIME_TYPE]
    kept = [len(rank["lines"]) for rank in payload["ranks"]]
    # equal shares, since every rank printed alike (few lines each: every card is full, 64 ranks share 200 KB, and
    # the fallbacks carry the same lines as the payload)
    assert min(kept) >= 1 and max(kept) - min(kept) <= 1
    assert bundle["text/plain"].count("line 249") == 2 * 64  # each rank's row (its last line) and its line
    assert bundle["text/plain"].count("line 246 ") == 0
    for rank, whole in zip(payload["ranks"], full["ranks"]):
        assert rank["lines"] == whole["lines"][len(whole["lines"]) - len(rank["lines"]):]  # the newest, in order
        assert rank["lines_total"] == 250 and rank["lines_dropped"] == 250 - len(rank["lines"])
        assert rank["status"] == whole["status"] and rank["progress"] == whole["progress"] and rank["history"]
    assert payload["saved"] == {"limit": SAVED_BYTES, "lines_total": 64 * 250, "lines_kept": sum(kept)}
    assert payload["failure"]["traceback"].startswith("T" * 1000) and "more characters in the run log" in \
        payload["failure"]["traceback"]
    assert "in the run log" in bundle["text/plain"] and "rank 63 line 249" in bundle["text/plain"]


def test_a_quiet_rank_leaves_its_share_of_the_budget_to_a_chatty_one():
    state = _big_run(16, 2, 40)
    for i in range(5000):  # rank 0 talks, the others said two lines each
        state.observe(Event(rank=0, seq=10_000 + i, time=time.monotonic(), kind=STREAM,
                            data={"stream": "stdout", "text": f"rank 0 says {i} " + "x" * 200}))
    payload = PanelDisplay(state, channel=None).bundle()[MIME_TYPE]
    assert [len(rank["lines"]) for rank in payload["ranks"][1:]] == [2] * 15
    assert len(payload["ranks"][0]["lines"]) == state.lines_per_rank  # the whole column: room was left over
    small = PanelDisplay(_big_run(2, 20, 40), channel=None).bundle()[MIME_TYPE]
    assert "saved" not in small and len(small["ranks"][0]["lines"]) == 20  # under budget: nothing is cut


class _Shell:
    """IPython's display() and its handle, recorded."""

    def __init__(self, monkeypatch):
        import IPython.display
        from IPython.core.interactiveshell import InteractiveShell

        self.bundles = []
        monkeypatch.setattr(InteractiveShell, "initialized", classmethod(lambda cls: True))
        monkeypatch.setattr(IPython.display, "display", lambda bundle, raw, display_id: self.bundles.append(bundle)
                            or self)

    def update(self, bundle, raw):
        self.bundles.append(bundle)


class _Comm:
    def __init__(self):
        self.sent, self.closed, self.on_msg_handler = [], False, None

    def send(self, data, buffers=None):
        self.sent.append(unpack(data, buffers))

    def close(self):
        self.closed = True

    def on_msg(self, handler):
        self.on_msg_handler = handler

    def on_close(self, handler):
        pass


def _line(clock, seq: int, rank: int, text: str) -> Event:
    return Event(rank=rank, seq=seq, time=clock[0], kind=STREAM, data={"stream": "stdout", "text": text})


def _listening_run(monkeypatch, num_ranks: int = 32):
    shell = _Shell(monkeypatch)
    clock = [1000.0]
    monkeypatch.setattr(panel_module.time, "monotonic", lambda: clock[0])
    channel = PanelChannel()
    state = RunState("run-1", "/tmp/run", "cpu", "gloo", "fork", num_ranks, num_ranks, list(range(num_ranks)))
    return shell, clock, channel, PanelDisplay(state, channel=channel)


def _rebuild(messages: list[dict]) -> dict:
    full = [m for m in messages if m["type"] == "full"][-1]
    seen = {**full["state"], "seq": full["seq"]}
    for message in messages[messages.index(full) + 1:]:
        assert message["base"] == seen["seq"]
        seen = apply_delta(seen, message, full["caps"])
    return seen


def test_without_a_listener_the_mime_output_is_the_live_view_as_before(monkeypatch):
    shell, clock, channel, panel = _listening_run(monkeypatch, num_ranks=2)
    for seq in range(1, 201):  # 20 lines a second for 10 s, nobody opened a comm
        clock[0] += 0.05
        panel.show(_line(clock, seq, seq % 2, f"line {seq}"))
    assert panel.deltas == 0
    interval = 1 / panel_module.MAX_UPDATES_PER_S  # each update at the first line once it is due
    assert 10 / (interval + 0.05) - 1 <= len(shell.bundles) <= 10 / interval + 1
    assert "line 200" in shell.bundles[-1]["text/plain"] or "line 199" in shell.bundles[-1]["text/plain"]
    final = panel.finish("finished")
    assert "line 200" in shell.bundles[-1]["text/plain"] and final["ranks"][0]["lines"][-1]["text"] == "line 200"


def test_a_listening_panel_gets_every_line_as_deltas_and_the_mime_output_is_refreshed_rarely(monkeypatch):
    shell, clock, channel, panel = _listening_run(monkeypatch)
    panel.show(_line(clock, 0, 0, "first"))  # the output appears; then the extension opens its comm
    first = _Comm()
    channel.on_open(first, {"content": {"data": {"run_id": "run-1"}}})
    before = len(shell.bundles)
    seq = 0
    for step in range(200):  # 10 s: every rank prints 20 lines a second
        clock[0] += 0.05
        for rank in range(32):
            seq += 1
            panel.show(_line(clock, seq, rank, f"rank {rank} line {step}"))
        if step == 100:  # a second tab (or a reload) opens its own comm halfway
            second = _Comm()
            channel.on_open(second, {"content": {"data": {"run_id": "run-1"}}})
    deltas = [m for m in first.sent if m["type"] == "delta"]
    interval = 1 / panel_module.DELTAS_PER_S
    assert first.sent[0]["type"] == "full" and 10 / (interval + 0.05) - 1 <= len(deltas) <= 10 / interval + 2
    refreshes = len(shell.bundles) - before
    assert 10 / panel_module.REFRESH_S - 1 <= refreshes <= 10 / panel_module.REFRESH_S + 1
    assert all(saved_size(bundle) <= panel_module.LIVE_BYTES for bundle in shell.bundles[before:])
    line_bytes = 32 * 200 * len("rank 10 line 100")
    assert sum(len(json.dumps(m)) for m in deltas) < 3 * line_bytes + 10 * 10_000
    final = panel.finish("finished")
    assert first.closed and second.closed
    whole = panel.state.to_json()
    seen = _rebuild(first.sent)
    assert _without_seq(seen) == {**whole, "elapsed": seen["elapsed"]}
    caught_up = _rebuild(second.sent)  # from the whole state halfway, then deltas: what the first tab has
    assert _without_seq(caught_up) == {**whole, "elapsed": caught_up["elapsed"]}
    assert [len(rank["lines"]) for rank in second.sent[0]["state"]["ranks"]][1:] == [101] * 31  # not cut
    for rebuilt in (seen, caught_up):
        assert [rank["lines_total"] for rank in rebuilt["ranks"]] == [201] + [200] * 31  # nothing lost
    assert second.sent[0]["state"]["ranks"][5]["lines_total"] == 101  # caught up at once, then deltas
    assert final == shell.bundles[-1][MIME_TYPE] and final["status"] == "finished"
    assert saved_size(shell.bundles[-1]) <= SAVED_BYTES and final["seq"] == seen["seq"]
    late = _Comm()  # a reload after the end: the final state, and the comm closes
    channel.on_open(late, {"content": {"data": {"run_id": "run-1"}}})
    assert late.sent[0]["ended"] and late.sent[0]["state"]["status"] == "finished" and late.closed
    stranger = _Comm()
    channel.on_open(stranger, {"content": {"data": {"run_id": "not-a-run"}}})
    assert stranger.sent == [{"type": "unknown", "run_id": "not-a-run"}] and stranger.closed


def test_a_panel_that_missed_a_delta_asks_for_the_whole_state_and_gets_it(monkeypatch):
    shell, clock, channel, panel = _listening_run(monkeypatch, num_ranks=2)
    panel.show(_line(clock, 0, 0, "first"))
    comm = _Comm()
    channel.on_open(comm, {"content": {"data": {"run_id": "run-1"}}})
    for seq in range(1, 40):
        clock[0] += 0.1
        panel.show(_line(clock, seq, seq % 2, f"line {seq}"))
    comm.on_msg_handler({"content": {"data": {"want": "full"}}})
    clock[0] += 0.1
    panel.show(_line(clock, 40, 0, "line 40"))
    fulls = [m for m in comm.sent if m["type"] == "full"]
    assert len(fulls) == 2 and fulls[1]["state"]["ranks"][0]["lines"][-1]["text"] == "line 40"
