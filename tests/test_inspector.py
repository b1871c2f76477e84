"""The run inspector on real run logs: real 2-process launches (a chatty one, a training-like one with ~300
prints, 12 warnings, an error and progress, a failed one), a 100,000-line log, and a real kernel's outputs."""

import os
import sys

import pytest

from notebook_launcher import RankFailedError, RunNotFoundError, get_logger, inspect_run, notebook_launcher, report
from notebook_launcher.display.inspector import RunInspector
from notebook_launcher.schema.events import Event
from notebook_launcher.schema.runlog import RUNS_DIR_ENV_VAR, RunLog

LINES = 30
HOSTILE = "<b>x</b> & <script>alert(1)</script>"


def chatty(lines):
    """Prints and logs on both ranks (defined at module level: a launched function)."""
    rank = int(os.environ["RANK"])
    logger = get_logger("chatty", log_level="DEBUG")
    for index in range(lines):
        print(f"rank {rank} line {index}")
    print(HOSTILE)
    print(f"to stderr from rank {rank}", file=sys.stderr)
    logger.debug(f"debug from rank {rank}", main_process_only=False)
    logger.info(f"info from rank {rank}", main_process_only=False)
    logger.warning(f"Warning from rank {rank}", main_process_only=False)
    logger.error(f"error from rank {rank}", main_process_only=False)
    return rank


def fails_on_rank_1():
    if int(os.environ["RANK"]) == 1:
        raise ValueError("bad value <here>\nsecond line of the message")
    import torch.distributed as dist

    dist.barrier()


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """One real run for the module (its log under a folder of its own)."""
    root = tmp_path_factory.mktemp("inspector_runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RUNS_DIR_ENV_VAR, str(root))
        assert notebook_launcher(chatty, args=(LINES,), num_processes=2, device="cpu") == 0
        from notebook_launcher import last_run

        return last_run()


@pytest.fixture
def inspector(launched, monkeypatch):
    monkeypatch.setenv(RUNS_DIR_ENV_VAR, os.path.dirname(launched.run_dir))
    panel = inspect_run(launched)
    yield panel
    panel.close()


def texts(rows):
    return [row.text for row in rows]


@pytest.mark.processes
def test_a_run_is_found_by_run_object_id_part_of_id_path_and_by_default(launched, monkeypatch):
    monkeypatch.setenv(RUNS_DIR_ENV_VAR, os.path.dirname(launched.run_dir))
    panels = [inspect_run(launched), inspect_run(launched.run_id), inspect_run(launched.run_id[-6:]),
              inspect_run(launched.run_dir), inspect_run(os.path.join(launched.run_dir, "events.jsonl")),
              inspect_run()]
    for panel in panels:
        assert isinstance(panel, RunInspector)
        assert os.path.samefile(panel.run_dir, launched.run_dir)
        assert panel.all_rows == panels[0].all_rows
    header = panels[1].header_text
    assert launched.run_id in header and "finished" in header and "2 ranks" in header and "cpu/gloo" in header
    assert f"{panels[0]._reader.events} events" in header
    for panel in panels:
        panel.close()


@pytest.mark.processes
def test_every_line_and_record_of_each_rank_is_a_row(inspector, launched):
    for rank in (0, 1):
        stdout = [row.text for row in inspector.all_rows if row.rank == rank and row.kind == "stdout"]
        assert stdout == launched.output(rank=rank, stream="stdout")
        assert stdout[:LINES] == [f"rank {rank} line {index}" for index in range(LINES)]
        logs = [(row.level, row.text) for row in inspector.all_rows if row.rank == rank and row.kind == "log"]
        assert logs == [("DEBUG", f"chatty: debug from rank {rank}"), ("INFO", f"chatty: info from rank {rank}"),
                        ("WARNING", f"chatty: Warning from rank {rank}"), ("ERROR", f"chatty: error from rank {rank}")]
    lines = [row.line for row in inspector.all_rows]
    assert lines == sorted(lines) and inspector.all_rows[0].time == 0.0
    assert all(row.time >= 0 for row in inspector.all_rows)
    assert inspector.event(inspector.all_rows[0].line)["kind"] == "status"


@pytest.mark.processes
def test_rank_filter(inspector):
    assert inspector.rank_filter.value == ("all",)
    assert [option[1] for option in inspector.rank_filter.options] == ["all", 0, 1]
    everything = len(inspector.rows)
    inspector.rank_filter.value = (1,)
    assert inspector.rows and {row.rank for row in inspector.rows} == {1}
    assert "rank 1 line 0" in texts(inspector.rows) and "rank 0 line 0" not in texts(inspector.rows)
    assert "[rank 0]" not in inspector.page_text
    inspector.rank_filter.value = ("all", 1)  # picking "all" again drops the particular ranks
    assert inspector.rank_filter.value == ("all",) and len(inspector.rows) == everything
    inspector.rank_filter.value = ("all", 0)  # picking a rank while "all" is chosen drops "all"
    assert inspector.rank_filter.value == (0,) and {row.rank for row in inspector.rows} == {0}


@pytest.mark.processes
def test_level_filter_shows_log_records_only(inspector):
    inspector.level_filter.value = 30  # WARNING
    assert sorted(texts(inspector.rows)) == sorted(
        f"chatty: {what} from rank {rank}" for what in ("Warning", "error") for rank in (0, 1))
    assert {row.kind for row in inspector.rows} == {"log"}  # output lines are not log records: hidden
    inspector.filter(kind="log", level="ERROR")
    assert texts(inspector.rows) and all(row.level == "ERROR" for row in inspector.rows)
    inspector.filter(level="all")
    assert len(inspector.rows) == 8


@pytest.mark.processes
def test_kind_filter(inspector):
    kinds = [option[1] for option in inspector.kind_filter.options]
    assert kinds[:4] == ["all", "stdout", "stderr", "log"] and {"exit", "status", "result"} <= set(kinds)
    inspector.kind_filter.value = ("stderr",)
    assert sorted(texts(inspector.rows)) == ["to stderr from rank 0", "to stderr from rank 1"]
    inspector.kind_filter.value = ("exit", "stderr")
    assert {row.kind for row in inspector.rows} == {"exit", "stderr"}
    assert sorted(row.text for row in inspector.rows if row.kind == "exit") == ["exit code 0", "exit code 0"]
    with pytest.raises(ValueError, match="not in this run"):
        inspector.filter(kind="nonsense")


@pytest.mark.processes
def test_search_is_case_insensitive_and_takes_a_regex(inspector):
    inspector.search.value = "WARNING FROM"
    assert sorted(texts(inspector.rows)) == ["chatty: Warning from rank 0", "chatty: Warning from rank 1"]
    assert "<mark>Warning from</mark>" in inspector.page_html
    inspector.filter(search=r"line (1|2)9$", regex=True)
    assert sorted(texts(inspector.rows)) == [f"rank {rank} line {index}" for rank in (0, 1) for index in (19, 29)]
    inspector.search.value = "line ("  # not a regular expression: said, and nothing passes
    assert inspector.rows == [] and "invalid regular expression" in inspector.status.value
    inspector.regex.value = False  # the same text, as plain text
    assert inspector.rows == [] and inspector.error == ""
    inspector.filter(search="", rank=1, kind="stdout")
    assert len(inspector.rows) == LINES + 1


@pytest.mark.processes
def test_html_is_escaped(inspector):
    inspector.search.value = "<b>x"
    assert [row.text for row in inspector.rows] == [HOSTILE, HOSTILE]
    page = inspector.page_html
    assert "<script>" not in page and "<b>x</b>" not in page
    assert "&lt;/b&gt; &amp; &lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<mark>&lt;b&gt;x</mark>" in page
    inspector.search.value = ""
    assert "<script>" not in inspector.page_html and "&lt;script&gt;" in inspector.page_html


@pytest.mark.processes
def test_paging_boundaries(inspector):
    inspector.filter(kind="stdout", rank=0)  # LINES + 1 rows
    inspector.page_size = 7
    total = LINES + 1
    assert inspector.page_count == -(-total // 7) == 5 and inspector.page == 1
    assert texts(inspector.page_rows) == [f"rank 0 line {index}" for index in range(7)]
    assert inspector.first_button.disabled and inspector.previous_button.disabled
    assert "page 1 of 5" in inspector.page_label.value
    inspector.previous_page()
    assert inspector.page == 1
    inspector.next_page()
    assert texts(inspector.page_rows)[0] == "rank 0 line 7"
    inspector.last_page()
    assert inspector.page == 5 and len(inspector.page_rows) == total - 4 * 7 == 3
    assert texts(inspector.page_rows)[-1] == HOSTILE
    assert inspector.next_button.disabled and inspector.last_button.disabled
    inspector.next_page()
    assert inspector.page == 5
    inspector.page = 0
    assert inspector.page == 1
    inspector.page = 10**6
    assert inspector.page == 5
    assert inspector.page_html.count("<tr") == 3 + 1  # the header row and this page's rows, nothing else
    target = inspector.rows[15]
    assert inspector.go_to_line(target.number) == target and inspector.page == 3
    assert "background:#fff3b0" in inspector.page_html
    assert inspector.go_to_line(target.number - 0) is target
    assert inspector.go_to_line(10**9) is None and inspector.page == 3
    inspector.search.value = "no such text anywhere"
    assert inspector.page_count == 1 and inspector.page == 1 and inspector.page_rows == []
    assert "no row passes the filters" in inspector.page_html


@pytest.mark.processes
def test_a_failed_run_shows_the_failure_and_its_traceback(monkeypatch, runs_dir):
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(fails_on_rank_1, num_processes=2, device="cpu")
    panel = inspect_run(caught.value)  # the error a launch raised leads to its run
    assert panel.run is caught.value.run
    assert "failed" in panel.header_text and "root cause: rank 1 ValueError: bad value <here>" in panel.header_text
    failures = [row for row in panel.all_rows if row.kind == "failure"]
    assert [(row.rank, row.text) for row in failures] == [(1, "ValueError: bad value <here>")]
    assert "Traceback" in failures[0].detail and "fails_on_rank_1" in failures[0].detail
    panel.filter(kind="failure")
    assert "<details><summary>ValueError: bad value &lt;here&gt;</summary>" in panel.page_html
    assert "bad value &lt;here&gt;" in panel.header.value
    panel.filter(search="second line of the message")  # the search sees the traceback too
    assert len(panel.rows) == 1
    panel.filter(search="", kind="all")
    panel.errors_button.value = True  # one click: the failure with its traceback, the exit it caused
    kept = [(row.rank, row.kind, row.text) for row in panel.rows]
    assert (1, "failure", "ValueError: bad value <here>") in kept and (1, "exit", "exit code 1") in kept
    assert not [row for row in panel.rows if row.kind in ("stdout", "status", "progress")]
    panel.close()


STEPS = 150


def training(steps):
    """Like a training loop: a print and a progress report per step (~300 lines on 2 ranks), an INFO record every
    10 steps, a warning every 25 (12 in all), one logged error on rank 1, two lines on stderr."""
    rank = int(os.environ["RANK"])
    logger = get_logger("train", log_level="INFO")
    print("loading 3 shards", file=sys.stderr)
    for step in range(1, steps + 1):
        print(f"rank {rank} step {step} loss {1 / step:.4f}")
        report(step=step, total=steps, loss=1 / step)
        if step % 10 == 0:
            logger.info(f"rank {rank} at step {step}", main_process_only=False)
        if step % 25 == 0:
            logger.warning(f"rank {rank}: slow batch at step {step}", main_process_only=False)
    if rank == 1:
        logger.error("rank 1: could not write the checkpoint", main_process_only=False)
    print("train.py:40: UserWarning: the learning rate is high", file=sys.stderr)
    return rank


WARNINGS = [f"train: rank {rank}: slow batch at step {step}" for step in range(25, STEPS + 1, 25) for rank in (0, 1)]
ERROR = "train: rank 1: could not write the checkpoint"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real training-like run, its log under a folder of its own."""
    root = tmp_path_factory.mktemp("training_runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(RUNS_DIR_ENV_VAR, str(root))
        assert notebook_launcher(training, args=(STEPS,), num_processes=2, device="cpu", display="text") == 0
        from notebook_launcher import last_run

        return last_run()


@pytest.fixture
def training_panel(trained, monkeypatch):
    monkeypatch.setenv(RUNS_DIR_ENV_VAR, os.path.dirname(trained.run_dir))
    panel = inspect_run(trained.run_id)
    yield panel
    panel.close()


@pytest.mark.processes
def test_at_warning_only_the_warnings_and_the_error_are_shown(training_panel):
    panel = training_panel
    kinds = {row.kind for row in panel.all_rows}
    assert {"stdout", "stderr", "progress", "log", "status", "exit"} <= kinds
    assert len([row for row in panel.all_rows if row.kind == "stdout"]) == 2 * STEPS
    panel.level_filter.value = 30  # what a user picks: "WARNING and above"
    assert sorted(texts(panel.rows)) == sorted(WARNINGS + [ERROR])
    assert len(panel.rows) == 13 and [row.text for row in panel.rows if row.rank == 1][-1] == ERROR
    assert "output lines and progress rows hidden" in panel.status.value
    assert "output lines (print, stderr) and progress rows are hidden" in panel.level_filter.tooltip
    assert [label for label, _ in panel.level_filter.options][3] == "WARNING and above"
    panel.filter(level="ERROR")
    assert texts(panel.rows) == [ERROR]
    panel.filter(level="INFO", rank=0)
    assert len(panel.rows) == STEPS // 10 + 6 and {row.kind for row in panel.rows} == {"log"}


@pytest.mark.processes
def test_errors_and_warnings_in_one_click(training_panel):
    panel = training_panel
    panel.errors_button.value = True
    assert panel.level_filter.value == "errors and warnings"
    expected = WARNINGS + [ERROR] + ["train.py:40: UserWarning: the learning rate is high"] * 2
    assert sorted(texts(panel.rows)) == sorted(expected)  # not "loading 3 shards" (stderr, but no error)
    assert "errors and warnings" in panel.status.value
    panel.errors_button.value = False  # a second click: every row again
    assert panel.level_filter.value == 0 and len(panel.rows) == len(panel.all_rows)
    panel.level_filter.value = "errors and warnings"  # the same choice in the level list presses the button
    assert panel.errors_button.value is True
    panel.filter(level="WARNING")
    assert panel.errors_button.value is False and len(panel.rows) == 13
    assert len(inspect_run(panel.run_id, level="errors and warnings").rows) == len(expected)


@pytest.mark.processes
def test_every_kind_is_listed_in_sight(training_panel):
    panel = training_panel
    options = [value for _, value in panel.kind_filter.options]
    assert options[0] == "all" and set(options[1:]) == {row.kind for row in panel.all_rows}
    assert panel.kind_filter.rows == len(options) >= 8  # the list is as tall as its entries: none scrolled away


@pytest.mark.processes
def test_rows_are_numbered_in_the_run(training_panel):
    panel = training_panel
    assert [row.number for row in panel.all_rows] == list(range(1, len(panel.all_rows) + 1))
    panel.filter(level="WARNING")
    first_warning = panel.rows[0]
    assert f'<td style="padding:0 8px 0 0;vertical-align:top;white-space:nowrap;color:#999">' \
           f'{first_warning.number}</td>' in panel.page_html
    assert panel.page_text.split()[0] == str(first_warning.number)
    assert ">#</th>" in panel.page_html
    panel.filter(level="all")  # the warning in its context: the rows just before it are that rank's step
    panel.page_size = 50
    assert panel.go_to_line(first_warning.number) == first_warning == panel.row(first_warning.number)
    assert panel.page == (first_warning.number - 1) // 50 + 1 and "background:#fff3b0" in panel.page_html
    before = [row for row in panel.all_rows[:first_warning.number - 1] if row.rank == first_warning.rank]
    assert before[-1].kind == "progress" and before[-2].text.startswith(f"rank {first_warning.rank} step 25 ")
    assert panel.event(first_warning.line)["data"]["message"] == first_warning.text.split(": ", 1)[1]


@pytest.mark.processes
def test_the_saved_summary_counts_what_each_rank_said(training_panel):
    panel = training_panel
    bundle = panel.saved_summary
    plain = bundle["text/plain"].splitlines()
    assert plain[0] == panel.header_text.splitlines()[0] and "finished" in plain[0]
    assert plain[2:4] == [f"rank 0: {STEPS + 2} output lines, 6 warnings, 0 errors, exit code 0",
                          f"rank 1: {STEPS + 2} output lines, 6 warnings, 1 error, exit code 0"]
    assert plain[-1].endswith(f"inspect_run({panel.run_id!r}) browses the whole log again.")
    page = bundle["text/html"]
    assert 'class="nl-inspector-saved"' in page and "nl-inspector" in panel._dom_classes
    assert f"inspect_run(&#x27;{panel.run_id}&#x27;)" in page and "font-family:var(--jp-code-font-family" in page


def synthetic_log(count):
    """A run log as RunLog writes it: four ranks, output lines, log records at four levels, progress."""
    log = RunLog()
    levels = (("DEBUG", 10), ("INFO", 20), ("WARNING", 30), ("ERROR", 40))
    for index in range(count):
        rank, when = index % 4, 100.0 + index / 1000
        if index % 2 == 0:
            event = Event(rank, index, when, "stream", {"stream": "stdout" if index % 10 else "stderr",
                                                        "text": f"batch {index} <i>ok</i>"})
        elif index % 4 == 1:
            name, number = levels[(index // 4) % 4]
            event = Event(rank, index, when, "log", {
                "level": name, "levelno": number, "logger": "train", "message": f"step {index}", "file": "t.py",
                "line": 1, "function": "f", "created": 0.0, "exc_text": None, "stack": None, "in_order": None})
        else:
            event = Event(rank, index, when, "progress", {"step": index, "total": count,
                                                          "metrics": {"loss": 0.25, "lr": 1e-3}})
        log.write(event)
    log.write_summary({"run_id": log.run_id, "status": "finished", "device": "cuda", "backend": "nccl",
                       "num_processes": 4, "world_size": 4, "duration_s": 123.4})
    log.close()
    return log


def test_a_100k_line_run_log(runs_dir):
    count = 100_000
    log = synthetic_log(count)
    panel = inspect_run(log.run_id)
    assert len(panel.all_rows) == len(panel.rows) == count
    header = panel.header_text
    assert "4 ranks" in header and "cuda/nccl" in header and "123.40 s" in header and "100,000 events" in header
    assert panel.page_count == count // 200 and panel.page_html.count("<tr") == 201
    panel.rank_filter.value = (3,)
    assert len(panel.rows) == count // 4 and all(row.rank == 3 for row in panel.rows)
    panel.filter(rank="all", kind="log", level="WARNING")
    assert len(panel.rows) == count // 4 // 2 and {row.level for row in panel.rows} == {"WARNING", "ERROR"}
    panel.filter(kind="stderr", level="all")
    assert len(panel.rows) == count // 10
    panel.filter(kind="progress")
    assert panel.rows[0].text == "step 3/100000  loss=0.25  lr=0.001"
    panel.filter(kind="all", search="BATCH 9999")
    assert texts(panel.rows) == [f"batch {index} <i>ok</i>" for index in (9999 * 10 + n for n in range(0, 10, 2))]
    panel.filter(search=r"^batch \d*0 <", regex=True)
    assert len(panel.rows) == count // 10
    panel.filter(search="", regex=False)
    panel.last_page()
    assert panel.page_rows[-1].line == count and "&lt;i&gt;ok&lt;/i&gt;" in panel.page_html
    assert panel.go_to_line(54_321).number == 54_321 and panel.page == 54_321 // 200 + 1
    panel.close()


def test_reload_reads_what_a_running_run_wrote_since(runs_dir, monkeypatch):
    monkeypatch.setattr(RunLog, "_FLUSH_EVERY_S", -1)  # every write reaches the file at once
    log = RunLog()
    for index in range(5):
        log.write(Event(index % 2, index, 10.0 + index, "stream", {"stream": "stdout", "text": f"early {index}"}))
    panel = inspect_run(log.path, page_size=4)
    assert len(panel.rows) == 5 and "no summary yet" in panel.header_text
    panel.last_page()
    log.write(Event(0, 5, 16.0, "progress", {"step": 5, "total": 10, "metrics": {"loss": 0.5}}))
    log.write(Event(1, 6, 17.0, "log", {"level": "INFO", "levelno": 20, "logger": "x", "message": "late"}))
    log._events.write('{"rank": 0, "seq": 7, "time": 18.0, "kind": "str')  # a line still being written
    log._events.flush()
    assert panel.reload() == 2
    assert texts(panel.all_rows)[-2:] == ["step 5/10  loss=0.5", "x: late"] and panel.all_rows[-1].time == 7.0
    assert panel.page == panel.page_count == 2  # it follows the end of the log
    assert "progress" in [option[1] for option in panel.kind_filter.options]
    log._events.write('eam", "data": {"stream": "stderr", "text": "finished line"}}\nnot json\n')
    log.close()
    log.write_summary({"run_id": log.run_id, "status": "failed", "world_size": 2})
    assert panel.reload() == 1
    assert panel.all_rows[-1].text == "finished line" and panel.all_rows[-1].kind == "stderr"
    assert "failed" in panel.header_text and "1 malformed record skipped" in panel.header_text
    panel.close()


def test_a_redrawn_progress_bar_is_one_row_its_newest_state(runs_dir, monkeypatch):
    monkeypatch.setattr(RunLog, "_FLUSH_EVERY_S", -1)
    log = RunLog()

    def line(rank, text, stream="stderr", redraw=False):
        data = {"stream": stream, "text": text, **({"redraw": True} if redraw else {})}
        log.write(Event(rank, 0, 1.0, "stream", data))

    for step in range(1, 4):
        line(0, f"bar {step}/3", redraw=True)
        line(1, f"rank 1 says {step}", stream="stdout")
        line(1, f"rank 1 bar {step}/9", redraw=True)
    line(0, "bar 3/3 done")  # the bar's end: its last state, as a line
    line(0, "another line")
    panel = inspect_run(log.path)
    assert [(row.rank, row.text) for row in panel.rows if row.kind == "stderr"] == [
        (1, "rank 1 bar 3/9"), (0, "bar 3/3 done"), (0, "another line")]
    assert len(panel.rows) == 6 and panel._reader.events == 11
    line(1, "rank 1 bar 4/9", redraw=True)  # still going: the new state replaces the one read before
    assert panel.reload() == 1
    assert [row.text for row in panel.rows if row.rank == 1 and row.kind == "stderr"] == ["rank 1 bar 4/9"]
    line(1, "rank 1 bar 9/9")
    log.close()
    panel.reload()
    assert [row.text for row in panel.rows if row.rank == 1 and row.kind == "stderr"] == ["rank 1 bar 9/9"]
    panel.close()


def test_unknown_runs_are_named_with_recent_ones(runs_dir):
    logs = [RunLog() for _ in range(2)]
    for log in logs:
        log.close()
    with pytest.raises(RunNotFoundError) as caught:
        inspect_run("20000101-000000-1-abcdef")
    message = str(caught.value)
    assert "inspect_run('20000101-000000-1-abcdef')" in message
    assert all(log.run_id in message for log in logs) and str(runs_dir) in message
    with pytest.raises(LookupError, match="no run id or run directory"):
        inspect_run(str(runs_dir / "nowhere"))
    with pytest.raises(RunNotFoundError, match="2 runs match"):
        inspect_run("-")  # part of every run id
    with pytest.raises(TypeError, match="run=42"):
        inspect_run(42)


def test_no_run_at_all(runs_dir, monkeypatch):
    from notebook_launcher import runs

    monkeypatch.setattr(runs, "_recent_runs", [])
    with pytest.raises(RunNotFoundError, match="no run was launched in this process"):
        inspect_run()
    log = RunLog()
    log.close()
    panel = inspect_run()  # after a kernel restart: the newest run on disk
    assert panel.run_id == log.run_id and panel.rows == [] and "no events" in panel.page_html
    panel.close()
