"""Hostile or careless files on disk: Accelerate config files and run log folders. Refused at once with the file
named, or read with bounds (never hanging, never following a link out of the folder, never reading a device);
real files, links and FIFOs in temp folders, real launches where the point is a launch."""

from __future__ import annotations

import json
import os
import signal
import stat
import time

import pytest
from helpers.processes import no_children_left

from notebook_launcher import LaunchArgumentError, RunNotFoundError, inspect_run, last_run, notebook_launcher
from notebook_launcher.accelerate_config import MAX_ALIASES, MAX_CONFIG_BYTES
from notebook_launcher.display.logview import MAX_SHOWN_CHARS, LogView
from notebook_launcher.runs import resolve_run
from notebook_launcher.schema import runfolders, runlog
from notebook_launcher.schema.events import PROGRESS, STREAM, Event
from notebook_launcher.schema.lines import StreamLines
from notebook_launcher.schema.runlog import RunFileRefused, RunLog, read_run_log


def returns_rank():
    import torch.distributed as dist

    return dist.get_rank()


# -- Accelerate config files ----------------------------------------------------------------------------------------
ALIAS_BOMB = "".join(['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n']
                     + [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 9)}]\n" for n in range(1, 10)]) + "debug: *l9\n"


@pytest.mark.parametrize("where", ["config_file=", "Accelerate's default file"])
@pytest.mark.processes
def test_a_yaml_alias_bomb_under_debug_fails_at_once_naming_the_file(where, tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    monkeypatch.delenv("ACCELERATE_CONFIG_FILE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    config = tmp_path / "hf" / "accelerate" / "default_config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(ALIAS_BOMB)
    keywords = {"config_file": str(config)} if where == "config_file=" else {}
    started = time.monotonic()
    with pytest.raises(LaunchArgumentError, match=rf"more than {MAX_ALIASES} YAML aliases") as caught:
        notebook_launcher(returns_rank, num_processes=2, device="cpu", **keywords)
    assert time.monotonic() - started < 5  # it took 84 s to expand (a bound, not a benchmark)
    assert str(config) in str(caught.value)
    no_children_left()


@pytest.mark.parametrize("content, says", [
    (b"debug: true\nname: caf\xe9\n", "is not UTF-8 text (b'\\xe9' at offset 21): save it as UTF-8"),
    (b"debug: [true, false]\n", "says debug: list, not true or false"),
    (b"- debug\n- true\n", "holds a list, not the mapping of settings"),
    (b"debug: true\nother: [\n", "is not valid YAML"),
    (b"# padding\n" * (MAX_CONFIG_BYTES // 10 + 1) + b"debug: true\n", "is over 256 KB"),
])
@pytest.mark.processes
def test_a_config_file_that_is_not_a_config_is_named_with_what_is_wrong(content, says, tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    config = tmp_path / "accelerate config.yaml"
    config.write_bytes(content)
    with pytest.raises(LaunchArgumentError) as caught:
        notebook_launcher(returns_rank, num_processes=2, device="cpu", config_file=str(config))
    assert f"the Accelerate config file {config} {says}" in str(caught.value)
    assert not isinstance(caught.value.__cause__, UnicodeDecodeError)
    no_children_left()


def test_a_config_file_with_a_few_aliases_still_reads(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_DEBUG_MODE", raising=False)
    config = tmp_path / "config.yaml"
    config.write_text("defaults: &on true\ndebug: *on\nmixed_precision: 'no'\n")
    from notebook_launcher.accelerate_config import resolve_debug

    assert resolve_debug(None, str(config)) is True
    config.write_text("debug: false\n")
    assert resolve_debug(None, str(config)) is False


# -- run logs: strict JSON, every run inspectable ---------------------------------------------------------------------
def strict(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def reports_nan_and_infinity():
    import torch.distributed as dist

    from notebook_launcher import get_logger, report

    report(step=1, total=2, loss=float("nan"), grad=float("inf"))
    get_logger("train").warning("loss is %s", float("nan"))
    return dist.get_rank()


@pytest.mark.processes
def test_a_run_that_recorded_nan_and_infinities_is_strict_json_and_inspectable(runs_dir):
    assert notebook_launcher(reports_nan_and_infinity, num_processes=2, device="cpu", display="text") == 0
    run = last_run()
    with open(os.path.join(run.run_dir, "events.jsonl"), encoding="utf-8") as source:
        records = [strict(line) for line in source]
    with open(os.path.join(run.run_dir, "run.json"), encoding="utf-8") as source:
        strict(source.read())
    progress = [record["data"] for record in records if record["kind"] == "progress"]
    assert len(progress) == 2  # (the rank sends non-finite metrics as text: "nan", "inf")
    panel = inspect_run(run, kind="progress")
    assert panel.page_text.count("step 1/2  loss=nan  grad=inf") == 2
    panel.close()


def test_nan_and_infinite_times_are_written_as_null_and_read_as_the_row_before(runs_dir):
    log = RunLog()
    log.write(Event(0, 0, 100.0, STREAM, {"stream": "stdout", "text": "first"}))
    log.write(Event(0, 1, float("nan"), STREAM, {"stream": "stdout", "text": "at NaN"}))
    log.write(Event(1, 2, float("inf"), PROGRESS, {"step": 1, "metrics": {"loss": float("-inf")}}))
    log.write(StreamLines(1, 3, float("nan"), "stdout", ["a line at NaN"]))
    log.write(Event(0, 4, 102.5, STREAM, {"stream": "stdout", "text": "last"}))
    log.write_summary({"run_id": log.run_id, "status": "finished", "duration_s": float("nan"), "world_size": 2})
    log.close()
    with open(log.file("events.jsonl"), encoding="utf-8") as source:
        lines = [strict(line) for line in source]
    assert [line["time"] for line in lines] == [100.0, None, None, None, 102.5]
    assert strict(open(log.file("run.json")).read())["duration_s"] is None
    panel = inspect_run(log.run_id)  # raised ValueError: cannot convert float NaN to integer
    assert [row.time for row in panel.all_rows] == [0.0, 0.0, 0.0, 0.0, 2.5]
    assert panel.page_text.splitlines()[1].split()[:4] == ["2", "0.000", "[rank", "0]"]
    panel.close()


def test_an_older_log_holding_nan_literals_is_inspectable(runs_dir):
    folder = runs_dir / "20240101-000000-1-abcdef"
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text(
        '{"rank":0,"seq":0,"time":5.0,"kind":"stream","data":{"stream":"stdout","text":"ok"}}\n'
        '{"rank":0,"seq":1,"time":NaN,"kind":"stream","data":{"stream":"stdout","text":"nan time"}}\n'
        '{"rank":1,"seq":2,"time":Infinity,"kind":"progress","data":{"step":2,"metrics":{"loss":NaN}}}\n')
    (folder / "run.json").write_text('{"status": "finished", "duration_s": NaN}')
    view = LogView(str(folder))
    assert [row.time for row in view.all_rows] == [0.0, 0.0, 0.0] and view.reader.malformed == 0
    assert "finished" in view.header_text and "step 2  loss=None" in view.page_text
    assert view.event(2)["time"] is None


# -- run logs: the readers trust nothing of the folder ------------------------------------------------------------
def run_folder(runs_dir, lines: list[str] | None = None):
    folder = runs_dir / "20240101-000000-1-abcdef"
    folder.mkdir(parents=True)
    if lines is not None:
        (folder / "events.jsonl").write_text("".join(line + "\n" for line in lines))
    return folder


GOOD = '{"rank":0,"seq":0,"time":1.0,"kind":"stream","data":{"stream":"stdout","text":"good line"}}'


def test_records_of_the_wrong_shape_are_skipped_and_counted(runs_dir):
    folder = run_folder(runs_dir, [
        GOOD,
        '{"rank":0,"seq":1,"time":1.0,"kind":["stream"],"data":{}}',  # a list for kind
        '{"rank":{"r":1},"seq":2,"time":1.0,"kind":"stream","data":{}}',  # a dict for rank
        '{"rank":"1","seq":3,"time":1.0,"kind":"stream","data":{"text":"rank as a string"}}',  # mixed rank types
        '{"rank":true,"seq":4,"time":1.0,"kind":"stream","data":{}}',
        '{"rank":1,"seq":5,"time":"soon","kind":"stream","data":{}}',
        '{"rank":1,"seq":6,"time":1.0,"kind":"log","data":[1, 2]}',
        '[1, 2, 3]', 'not json', '{"rank":1,"seq":7', "[" * 100_000,
        '', '   ',  # blank lines are nothing
        '{"rank":1,"seq":8,"time":2.0,"kind":"stream","data":{"stream":{"a":1},"text":["x"]}}',  # fields: shown
        '{"rank":1,"seq":9,"time":2.0,"kind":"oom_retry","data":{"ranks":7,"batch_size":{},"error":3}}',
        '{"rank":1,"seq":10,"time":2.0,"kind":"progress","data":{"step":"x","metrics":[1],"total":{}}}',
        '{"rank":1,"seq":11,"time":2.0,"kind":"balance","data":{"elapsed":"1","cuda":[]}}',
        '{"rank":1,"seq":12,"time":2.0,"kind":"log","data":{"message":{},"levelno":"high","exc_text":5}}',
        '{"rank":1,"seq":13,"time":2.0,"kind":"a-new-kind","data":{"x":[1,{"y":2}]}}',
    ])
    panel = inspect_run(str(folder))
    assert panel.view.reader.malformed == 10
    assert "10 malformed records skipped" in panel.header_text
    assert panel.view.rank_options == [0, 1] and panel.view.kind_options[:1] == ["stdout"]
    assert [row.line for row in panel.all_rows] == [1, 14, 15, 16, 17, 18, 19]
    assert panel.all_rows[1].text == "['x']" and panel.all_rows[1].kind == "stdout"
    panel.filter(rank=1, search="x")
    panel.page_text, panel.page_html, panel.view.event(19)
    with pytest.raises(ValueError, match="line 2 of .* is not a record of the run log"):
        panel.view.event(2)
    panel.close()


@pytest.mark.parametrize("target", ["/etc/passwd", "/dev/zero", "another run's log"])
def test_events_jsonl_as_a_link_out_of_the_run_folder_is_not_read(target, runs_dir):
    folder = run_folder(runs_dir)
    if target == "another run's log":
        other = run_folder(runs_dir.parent / "elsewhere", [GOOD])
        target = str(other / "events.jsonl")
    (folder / "events.jsonl").symlink_to(target)
    (folder / "run.json").symlink_to("/etc/hostname")
    view = LogView(*resolve_run(str(folder)))
    assert view.all_rows == [] and view.summary == {}
    assert f"events.jsonl not read: {folder / 'events.jsonl'} is a link out of the run folder" in view.header_text
    with pytest.raises(RunFileRefused, match="a link out of the run folder"):
        read_run_log(str(folder))
    with pytest.raises(RunFileRefused):
        view.event(1)


def test_a_link_inside_the_run_folder_is_read(runs_dir):
    folder = run_folder(runs_dir)
    (folder / "saved.jsonl").write_text(GOOD + "\n")
    (folder / "events.jsonl").symlink_to("saved.jsonl")
    assert [row.text for row in LogView(str(folder)).all_rows] == ["good line"]


def test_a_run_folder_that_is_a_link_out_of_the_runs_folder_is_not_listed(runs_dir, tmp_path):
    elsewhere = run_folder(tmp_path / "elsewhere", [GOOD])
    runs_dir.mkdir()
    (runs_dir / "20240101-000000-2-abcdef").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(RunNotFoundError):
        resolve_run("20240101-000000-2-abcdef")


@pytest.mark.parametrize("special", ["fifo", "device", "folder"])
def test_a_special_file_as_events_jsonl_is_refused_without_hanging(special, runs_dir):
    folder = run_folder(runs_dir)
    path = folder / "events.jsonl"
    if special == "fifo":
        os.mkfifo(path)
    elif special == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    else:
        path.mkdir()
    signal.alarm(20)  # a hang fails the test instead of the suite (it hung forever on a FIFO)
    try:
        view = LogView(str(folder))
        with pytest.raises(RunFileRefused, match="not a regular file"):
            read_run_log(str(folder))
    finally:
        signal.alarm(0)
    what = {"fifo": "a FIFO", "device": "a device", "folder": "a folder"}[special]
    assert view.all_rows == [] and f"is {what}, not a regular file: not read" in view.header_text


def test_a_line_over_the_bound_is_skipped_unread_and_long_rows_are_cut_on_the_page(runs_dir, monkeypatch):
    monkeypatch.setattr(runlog, "MAX_RECORD_BYTES", 2**20)  # the bound (16 MB), smaller: the same code path
    text = "y" * 300_000
    folder = run_folder(runs_dir, [
        GOOD, '{"rank":0,"seq":1,"time":1.0,"kind":"stream","data":{"text":"' + "x" * (3 * 2**20) + '"}}',
        '{"rank":0,"seq":2,"time":1.5,"kind":"stream","data":{"stream":"stderr","text":"' + text + '"}}', GOOD])
    view = LogView(str(folder))
    assert [row.line for row in view.all_rows] == [1, 3, 4] and view.all_rows[1].text == text
    assert "1 malformed record skipped" in view.header_text
    assert len(view.page_text) < 3 * MAX_SHOWN_CHARS and "298,000 more characters" in view.page_text
    assert view.event(3)["data"]["text"] == text  # the whole record is still there


def test_a_line_over_the_bound_still_being_written_is_skipped_as_it_grows(runs_dir, monkeypatch):
    monkeypatch.setattr(runlog, "MAX_RECORD_BYTES", 2**20)
    folder = run_folder(runs_dir, [GOOD])
    view = LogView(str(folder))
    with open(folder / "events.jsonl", "a") as log:
        log.write('{"rank":0,"seq":1,"time":1.0,"kind":"stream","data":{"text":"' + "x" * (2 * 2**20))
        log.flush()
        assert view.reload() == 0 and view.reader.malformed == 1
        log.write("x" * 2**20 + '"}}\n' + GOOD + "\n")
    assert view.reload() == 1 and [row.line for row in view.all_rows] == [1, 3]
    assert view.reader.malformed == 1 and view.reader.lines == 3


def test_read_run_log_skips_malformed_records_with_a_count(runs_dir):
    folder = run_folder(runs_dir, [GOOD, "not json", '{"rank":[0],"kind":"x"}', GOOD])
    with pytest.warns(UserWarning, match="2 malformed records skipped"):
        records = read_run_log(str(folder))
    assert [record["data"]["text"] for record in records] == ["good line", "good line"]


# -- pruning a shared runs folder, and run ids drawn twice ------------------------------------------------------------
def finished_runs(runs_dir, count: int, when: float) -> None:
    for index in range(count):
        folder = runs_dir / f"20000102-000000-{100000 + index}-abcdef"
        folder.mkdir(parents=True)
        (folder / "run.json").write_text("{}")
        for path in (folder / "run.json", folder):
            os.utime(path, (when + index, when + index))


def test_pruning_spares_a_run_of_another_machine_while_its_log_grows_and_prunes_it_once_quiet(runs_dir):
    old = time.time() - 2 * runlog.PRUNE_MIN_AGE_S
    finished_runs(runs_dir, runlog.KEEP_RUNS, old)
    elsewhere = {}
    for name, log_changed in (("growing", time.time() - 5), ("quiet", old - 100)):
        # a kernel on another machine sharing the folder: its pid means nothing here, no summary yet
        folder = elsewhere[name] = runs_dir / f"20000101-000000-999999999-00000{len(elsewhere)}"
        folder.mkdir()
        (folder / "events.jsonl").write_text(GOOD + "\n")
        os.utime(folder / "events.jsonl", (log_changed, log_changed))
        os.utime(folder, (old - 100, old - 100))  # a folder's time does not move while a file in it grows
    RunLog(str(runs_dir)).close()
    assert elsewhere["growing"].is_dir()
    assert not elsewhere["quiet"].exists()  # quiet for longer than the margin: over, and the oldest
    assert len(list(runs_dir.glob("20000102-*"))) == runlog.KEEP_RUNS


def waits_until_its_log_is_touched(runs_root: str):
    """Rank 0 sets its run's events.jsonl back an hour, then waits (saying nothing) for the kernel to touch it."""
    import torch.distributed as dist

    fresh = True
    if dist.get_rank() == 0:
        (name,) = [entry for entry in os.listdir(runs_root) if runlog.RUN_ID.fullmatch(entry)]
        log = os.path.join(runs_root, name, "events.jsonl")
        hour_ago = time.time() - 3600
        os.utime(log, (hour_ago, hour_ago))
        deadline = time.monotonic() + 60
        while os.stat(log).st_mtime < hour_ago + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        fresh = time.time() - os.stat(log).st_mtime < runlog.PRUNE_MIN_AGE_S
    dist.barrier()
    return fresh


@pytest.mark.processes
def test_a_quiet_run_keeps_its_log_fresh_for_any_machines_pruning(runs_dir, monkeypatch):
    monkeypatch.setattr(runlog, "KEEPALIVE_S", 0.2)  # (60 s: the same code, sooner)
    assert notebook_launcher(waits_until_its_log_is_touched, args=(str(runs_dir),), num_processes=2,
                             device="cpu") is True
    no_children_left()


@pytest.mark.processes
def test_a_run_id_drawn_again_takes_a_fresh_folder_and_leaves_the_other_alone(runs_dir, monkeypatch):
    taken = runs_dir / "20000101-000000-1-aaaaaa"
    taken.mkdir(parents=True)
    (taken / "events.jsonl").write_text(GOOD + "\n")
    draws = iter([taken.name, taken.name, "20000101-000000-1-bbbbbb"])  # the random part, drawn the same twice
    monkeypatch.setattr(runfolders, "run_id", lambda: next(draws))
    assert notebook_launcher(returns_rank, num_processes=2, device="cpu") == 0
    assert last_run().run_id == "20000101-000000-1-bbbbbb"
    assert (taken / "events.jsonl").read_text() == GOOD + "\n"
    no_children_left()


@pytest.mark.processes
def test_run_ids_taken_every_time_say_so_not_that_the_folder_cannot_be_written(runs_dir, monkeypatch):
    taken = runs_dir / "20000101-000000-1-aaaaaa"
    taken.mkdir(parents=True)
    monkeypatch.setattr(runfolders, "run_id", lambda: taken.name)
    with pytest.raises(FileExistsError) as caught:
        notebook_launcher(returns_rank, num_processes=2, device="cpu")
    message = str(caught.value)
    assert "you can write to" not in message
    assert f"cannot make a new run folder in {runs_dir}" in message and taken.name in message
    assert "something other than this launcher makes folders named like run ids there" in message
    no_children_left()
