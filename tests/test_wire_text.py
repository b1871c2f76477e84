"""Every string a rank sends is valid for the wire, and every display a rank makes arrives or is replaced by its
text: a lone surrogate ("\\ud800") on any route (display, log message and logger name, metric name, warning,
exception, a result's error) arrives as its backslash escape with one note for the run, in plain Python with the
text display and in a real Jupyter kernel with the panel; JSON nested deeper than the kernel reads or an int
beyond 64 bits goes as its text; IPython's and ipywidgets' calls on a rank's display hook (a failing
``_repr_html_``, ``interact``, ``with Output():``) work. Real launches, 2 ranks, gloo."""

from __future__ import annotations

import json

import psutil
import pytest
from helpers.kernel import _assert_ok, _env, _panel, _panel_lines, _rank_outputs, _stream, kernel_with_log, run_cell

from notebook_launcher import RankFailedError, ResultUnavailableError, last_run, notebook_launcher
from notebook_launcher.schema.decoding import FrameDecoder
from notebook_launcher.schema.events import DISPLAY, EventWriter, encode_frame
from notebook_launcher.schema.wiretext import wire_safe, wire_text

ESCAPED = "\\ud800"  # what a rank's "\ud800" arrives as: six characters
NOTE = "held lone surrogates such as \\ud800"


def no_children_left():
    assert psutil.Process().children(recursive=True) == []


def sends_a_surrogate(route):
    """Every rank sends "\\ud800" on ``route``; rank 0 returns its rank."""
    import logging
    import warnings

    import torch.distributed as dist

    from notebook_launcher import get_logger, report

    rank = dist.get_rank()
    text = f"rank {rank} says " + chr(0xD800)
    if route == "log message":
        get_logger("wire").warning(text, main_process_only=False)
    elif route == "logger name":
        get_logger("wire" + chr(0xD800)).warning(f"rank {rank} logs", main_process_only=False)
    elif route == "plain logging with an exception":
        try:
            raise ValueError(text)
        except ValueError:
            logging.getLogger("plain").exception("caught")
    elif route == "metric name":
        report(step=1, **{"loss" + chr(0xD800): 0.5})
    elif route == "warning":
        warnings.warn(text)
    elif route == "print":
        print(text)
    return rank


ROUTES = ["log message", "logger name", "plain logging with an exception", "metric name", "warning", "print"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.processes
def test_a_lone_surrogate_on_each_route_arrives_escaped_with_one_note_and_the_result(route, capsys):
    assert notebook_launcher(sends_a_surrogate, args=(route,), num_processes=2, device="cpu", display="text") == 0
    out = capsys.readouterr().out
    run = last_run()
    assert run.status == "finished" and json.load(open(f"{run.run_dir}/run.json"))["status"] == "finished"
    if route == "metric name":
        progress = [event for event in run.events if event.kind == "progress"]
        assert [list(event.data["metrics"]) for event in progress] == [["loss" + ESCAPED]] * 2
    else:
        for rank in (0, 1):  # each rank's line, in the text display, with the escape
            assert [line for line in out.splitlines() if line.startswith(f"[rank {rank}]") and ESCAPED in line], out
    assert out.count(NOTE) == 1, out  # once per run, whichever ranks escaped text
    for line in open(f"{run.run_dir}/events.jsonl"):
        assert "\\ud800" not in json.dumps(json.loads(line), ensure_ascii=False).replace(ESCAPED, "")
    no_children_left()


def raises_with_a_surrogate():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("bad value " + chr(0xD800))
    return 0


@pytest.mark.parametrize("display", ["text", "panel"])
@pytest.mark.processes
def test_an_exception_with_a_surrogate_fails_its_rank_clearly(display, capsys):
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(raises_with_a_surrogate, num_processes=2, device="cpu", display=display)
    message = str(caught.value)
    assert f"ValueError: bad value {ESCAPED}" in message
    message.encode("utf-8")  # (strict: nothing left that Jupyter or a terminal cannot take)
    run = last_run()
    assert run.status == "failed" and json.load(open(f"{run.run_dir}/run.json"))["status"] == "failed"
    out = capsys.readouterr().out
    if display == "text":
        assert out.count(NOTE) == 1, out
    else:  # the panel's final state, what the notebook keeps (where an IPython shell runs without a frontend,
        # as in this suite after the magic's tests, each update is also printed: as many as the load allows)
        assert sum(NOTE in note for note in run.panel_state["notes"]) == 1, run.panel_state["notes"]
        assert NOTE in out
    no_children_left()


class _RebuiltWithAnError:
    """A value whose unpickling in the kernel raises with a lone surrogate in its message."""

    def __reduce__(self):
        return _refuse, ("cannot rebuild " + chr(0xD800),)


def _refuse(message):
    raise ValueError(message)


def returns_what_cannot_be_rebuilt():
    return _RebuiltWithAnError()


@pytest.mark.processes
def test_a_results_error_with_a_surrogate_is_escaped():
    with pytest.raises(ResultUnavailableError) as caught:
        notebook_launcher(returns_what_cannot_be_rebuilt, num_processes=2, device="cpu", display="text")
    assert f"cannot rebuild {ESCAPED}" in str(caught.value)
    str(caught.value).encode("utf-8")
    no_children_left()


def test_the_writer_escapes_every_frame_and_says_it_once_and_the_reader_escapes_what_another_writer_left(tmp_path):
    """The writer's side of every frame (text, record, event, parts), read back by the kernel's reader; and a
    frame written by other code than ``EventWriter`` comes out of the reader escaped too."""
    import os

    read, write = os.pipe()
    writer = EventWriter(write, 3)
    writer.emit_text(0, "out \udc80\n")
    writer.emit_record(("INFO", 20, "log\ud800", "msg \udfff", "f.py", 1, "f", 1.0))
    writer.emit(DISPLAY, {"op": "display", "data": {"text/plain": "\ud800", "x\ud800": {"k\ud800": ["\ud800"]}}})
    writer.emit_parts("result", {"type": "T\ud800", "kept": False, "reason": "r"}, [])
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    decoder = FrameDecoder(rank_pipe=True)
    headers = [header for header, _ in decoder.feed(data)]
    assert not decoder.broken
    assert headers[0] == (0, "out \\udc80\n")
    assert headers[1]["kind"] == "text_escaped" and headers[1]["data"] == {"route": "output"}  # once, after it
    assert headers[2][2:6] == ("INFO", 20, "log\\ud800", "msg \\udfff")
    assert [header["kind"] for header in headers[3:]] == ["display", "result"]
    assert headers[3]["data"]["data"] == {"text/plain": ESCAPED, "x" + ESCAPED: {"k" + ESCAPED: [ESCAPED]}}
    assert headers[4]["data"]["type"] == "T" + ESCAPED
    crafted = FrameDecoder(rank_pipe=True).feed(encode_frame(1, 1, "log", {"message": "m\ud800", "logger": "l"}))
    assert crafted[0][0]["data"]["message"] == "m" + ESCAPED
    assert wire_text("emoji \U0001F600 and \ud55c") == "emoji \U0001F600 and \ud55c"  # real characters stay
    value = {"a": ["b", ("c",)]}
    assert wire_safe(value) is value


# -- in a real Jupyter kernel: the panel's path through jupyter_client -------------------------------------------
SURROGATE_CELL = '''\
from notebook_launcher import notebook_launcher

def everywhere():
    import torch.distributed as dist
    from IPython.display import display
    from notebook_launcher import get_logger, report
    rank = dist.get_rank()
    bad = chr(0xD800)
    display(f"shown by rank {rank} {bad}")
    get_logger("wire" + bad).warning(f"logged by rank {rank} {bad}", main_process_only=False)
    report(step=1, **{"loss" + bad: 0.5})
    return f"rank {rank}"

notebook_launcher(everywhere, num_processes=2, display=DISPLAY)
'''
FAILING_CELL = '''\
def fails():
    import torch.distributed as dist
    if dist.get_rank() == 1:
        raise ValueError("bad value " + chr(0xD800))

notebook_launcher(fails, num_processes=2)
'''


@pytest.mark.slow
@pytest.mark.kernel
def test_surrogates_in_a_kernel_reach_the_panel_escaped_and_the_kernel_answers(tmp_path, runs_dir):
    with kernel_with_log(tmp_path, _env(runs_dir)) as (kc, _log):
        for display in ("panel", "auto"):
            reply, outputs = run_cell(kc, SURROGATE_CELL.replace("DISPLAY", repr(display)), timeout=120)
            _assert_ok(reply, outputs)
            assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] \
                == ["'rank 0'"]
            panel = _panel(outputs)
            assert len([note for note in panel["notes"] if NOTE in note]) == 1, panel["notes"]  # once per run
            for rank in (0, 1):
                lines = "\n".join(_panel_lines(panel, rank))
                assert f"shown by rank {rank} {ESCAPED}" in lines and f"logged by rank {rank} {ESCAPED}" in lines
                assert list(panel["ranks"][rank]["progress"]["metrics"]) == ["loss" + ESCAPED]
            (_, shown), = _rank_outputs(outputs)
            assert shown[0]["text/plain"] == f"[rank 0] 'shown by rank 0 {ESCAPED}'"
        reply, outputs = run_cell(kc, FAILING_CELL, timeout=120)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "RankFailedError"
        assert f"ValueError: bad value {ESCAPED}" in reply["content"]["evalue"]
        reply, outputs = run_cell(kc, "21 * 2")
        _assert_ok(reply, outputs)


WIDGETS_CELL = '''\
from notebook_launcher import notebook_launcher

def ipython_and_widgets():
    import ipywidgets
    import torch.distributed as dist
    from IPython.display import JSON, display
    rank = dist.get_rank()

    class Fails:
        def _repr_html_(self):
            raise RuntimeError(f"no html on rank {rank}")

        def __repr__(self):
            return f"plain text of rank {rank}"

    display(Fails())
    ipywidgets.interact(lambda x: print(f"interact called with x={x} on rank {rank}"), x=3)
    with ipywidgets.Output():
        print(f"inside Output on rank {rank}")
        display(f"displayed inside Output on rank {rank}")
    deep = 1
    for _ in range(80):
        deep = [deep]
    display(JSON(deep))
    display({"application/json": {"n": 2**70}, "text/plain": f"big int of rank {rank}"}, raw=True)
    return rank

notebook_launcher(ipython_and_widgets, num_processes=2)
'''


@pytest.mark.slow
@pytest.mark.kernel
def test_ipython_and_ipywidgets_calls_in_a_rank_work_and_every_display_arrives(tmp_path, runs_dir):
    pytest.importorskip("ipywidgets")
    with kernel_with_log(tmp_path, _env(runs_dir)) as (kc, log_path):
        reply, outputs = run_cell(kc, WIDGETS_CELL, timeout=120)
        _assert_ok(reply, outputs)
        assert [m["content"]["data"]["text/plain"] for m in outputs if m["msg_type"] == "execute_result"] == ["0"]
        panel = _panel(outputs)
        for rank in (0, 1):
            lines = "\n".join(_panel_lines(panel, rank))
            assert f"RuntimeError: no html on rank {rank}" in lines  # IPython's traceback, on the rank's stderr
            assert f"[display] plain text of rank {rank}" in lines  # ... and the display, as its text
            assert f"interact called with x=3 on rank {rank}" in lines
            assert f"inside Output on rank {rank}" in lines
            assert f"[display] 'displayed inside Output on rank {rank}'" in lines
            assert "(without application/json)" in lines and f"big int of rank {rank}" in lines
            assert "nests lists and dicts deeper than 64 or holds an int beyond 64 bits" in lines
            assert "AttributeError" not in lines
        texts = [bundles[0].get("text/plain") for _, bundles in _rank_outputs(outputs)]
        assert "[rank 0] plain text of rank 0" in texts and "[rank 0] big int of rank 0" in texts
        assert "[rank 0] 'displayed inside Output on rank 0'" in texts
        reply, outputs = run_cell(kc, "print('still here')")
        _assert_ok(reply, outputs)
        assert "still here" in _stream(outputs)
    assert "from fork" not in log_path.read_text()
