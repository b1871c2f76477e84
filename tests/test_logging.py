"""Rank-aware logging through real launches: main_process_only, in_order ordered by the kernel, nothing lost."""

import logging
import os
import signal
import textwrap
import time

import pytest
from helpers.processes import run_torchrun

from notebook_launcher import RankFailedError, get_logger, last_run, notebook_launcher


@pytest.fixture(autouse=True)
def no_log_level_from_the_environment(monkeypatch):
    monkeypatch.delenv("ACCELERATE_LOG_LEVEL", raising=False)


def rank_lines(text, rank):
    prefix = f"[rank {rank}] "
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


def four_calls():
    logger = get_logger("mymodule", log_level="DEBUG")
    logger.info("on the main process only")
    logger.debug("thing_to_log", main_process_only=False)
    logger.debug("thing_to_log", main_process_only=False, in_order=True)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.processes
def test_the_four_calls_give_exactly_the_expected_lines(start_method, capsys):
    notebook_launcher(four_calls, num_processes=3, start_method=start_method, device="cpu")
    out = capsys.readouterr().out
    assert rank_lines(out, 0) == ["INFO mymodule: on the main process only", "DEBUG mymodule: thing_to_log",
                                  "DEBUG mymodule: thing_to_log"]
    for rank in (1, 2):
        assert rank_lines(out, rank) == ["DEBUG mymodule: thing_to_log", "DEBUG mymodule: thing_to_log"]
    in_order_lines = [line for line in out.splitlines() if line.endswith("thing_to_log")]
    last_of_each = {line[:8]: index for index, line in enumerate(in_order_lines)}
    assert sorted(last_of_each, key=last_of_each.get) == ["[rank 0]", "[rank 1]", "[rank 2]"]


def in_order_with_a_slow_rank_0(calls):
    import random

    logger = get_logger("ordered", log_level="INFO")
    rank = int(os.environ["RANK"])
    for call in range(calls):
        if rank == 0:
            time.sleep(random.uniform(0, 0.02))
        logger.info(f"call {call} from rank {rank}", main_process_only=False, in_order=True)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.processes
def test_in_order_records_appear_in_rank_order_every_time(start_method, capsys):
    notebook_launcher(in_order_with_a_slow_rank_0, args=(50,), num_processes=3, start_method=start_method,
                      device="cpu")
    lines = [line for line in capsys.readouterr().out.splitlines() if "INFO ordered: call" in line]
    expected = [f"[rank {rank}] INFO ordered: call {call} from rank {rank}" for call in range(50) for rank in range(3)]
    assert lines == expected


def different_levels():
    logger = get_logger("levels")
    rank = int(os.environ["RANK"])
    logger.setLevel(logging.INFO if rank == 1 else logging.DEBUG)  # rank 1 filters the debug records out
    for call in range(20):
        logger.debug(f"debug {call}", main_process_only=False, in_order=True)
    logger.info("done", main_process_only=False, in_order=True)
    return rank


@pytest.mark.processes
def test_ranks_with_different_levels_neither_deadlock_nor_stall(capsys):
    started = time.monotonic()
    notebook_launcher(different_levels, num_processes=3, device="cpu", timeout=60)
    assert time.monotonic() - started < 15  # the kernel does not wait out a bound per filtered record
    out = capsys.readouterr().out
    assert rank_lines(out, 1) == ["INFO levels: done"]
    for rank in (0, 2):
        assert rank_lines(out, rank) == [f"DEBUG levels: debug {call}" for call in range(20)] + ["INFO levels: done"]
    done = [line for line in out.splitlines() if line.endswith("INFO levels: done")]
    assert done == [f"[rank {rank}] INFO levels: done" for rank in range(3)]


@pytest.mark.processes
def test_accelerate_log_level_set_in_the_kernel_before_the_launch_is_respected(monkeypatch, capsys):
    def log_two():
        logger = get_logger("envlevel")
        logger.info("info line", main_process_only=False)
        logger.warning("warning line", main_process_only=False)

    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "warning")
    notebook_launcher(log_two, num_processes=2, device="cpu")
    assert rank_lines(capsys.readouterr().out, 1) == ["WARNING envlevel: warning line"]
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "info")
    notebook_launcher(log_two, num_processes=2, device="cpu")
    assert rank_lines(capsys.readouterr().out, 1) == ["INFO envlevel: info line", "WARNING envlevel: warning line"]


def call_sites():
    logger = get_logger("sites", log_level="DEBUG")
    logger.info("plain", main_process_only=False)
    logger.warning_once("once", main_process_only=False)
    logger.warning_once("once", main_process_only=False)
    logger.log(logging.ERROR, "direct", main_process_only=False)
    logging.getLogger("stdlib").warning("stdlib logger")


@pytest.mark.processes
def test_records_carry_the_users_call_site():
    notebook_launcher(call_sites, num_processes=2, device="cpu")
    records = [e.data for e in last_run().events if e.kind == "log" and e.rank == 1]
    source_lines = open(__file__).read().splitlines()
    messages = [r["message"] for r in records]
    assert messages == ["plain", "once", "direct", "stdlib logger"]  # warning_once: once
    for record in records:
        assert record["file"] == __file__ and record["function"] == "call_sites"
        assert record["message"].split()[0] in source_lines[record["line"] - 1]


@pytest.mark.processes
def test_logging_after_an_exception_and_before_a_sigkill_arrives():
    def log_then_die():
        only_our_handler()  # (the records without an exception take the shorter way, as in a notebook)
        logger = get_logger("dying", log_level="INFO")
        rank = int(os.environ["RANK"])
        try:
            raise KeyError("missing")
        except KeyError:
            logger.exception("handled", main_process_only=False)
        logger.info("after the exception", main_process_only=False)
        if rank == 1:
            for index in range(200):
                logger.info(f"last words {index}", main_process_only=False)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)

    with pytest.raises(RankFailedError, match="Rank 1 failed first: killed by SIGKILL"):
        notebook_launcher(log_then_die, num_processes=2, device="cpu")
    records = [e.data for e in last_run().events if e.kind == "log" and e.rank == 1]
    assert records[0]["message"] == "handled" and "KeyError: 'missing'" in records[0]["exc_text"]
    assert records[1]["message"] == "after the exception"
    assert [r["message"] for r in records[2:]] == [f"last words {index}" for index in range(200)]


@pytest.mark.processes
def test_records_and_prints_of_a_forked_helper_and_its_rank_arrive_whole_side_by_side():
    """A DataLoader worker (a process the rank forks) shares the rank's event pipe: each of its frames is one
    atomic write, a long one cut to fit, so neither its records nor the rank's are torn or lost."""
    def rank_and_helper():
        only_our_handler()
        logger = get_logger("helper", log_level="INFO")
        child = os.fork()
        who = "helper" if child == 0 else "rank"
        for index in range(300):
            logger.info("%s record %d", who, index, main_process_only=False)
            print(f"{who} print {index}")
        if child == 0:
            logger.info("x" * 10_000, main_process_only=False)  # longer than one atomic pipe write
            os._exit(0)
        os.waitpid(child, 0)

    notebook_launcher(rank_and_helper, num_processes=2, device="cpu")
    run = last_run()
    assert not [e for e in run.events if e.kind == "failure"]
    for rank in (0, 1):
        records = [e.data["message"] for e in run.events if e.kind == "log" and e.rank == rank]
        prints = [e.data["text"] for e in run.events if e.kind == "stream" and e.rank == rank]
        for who in ("rank", "helper"):
            assert [m for m in records if m.startswith(who)] == [f"{who} record {i}" for i in range(300)]
            assert [t for t in prints if t.startswith(who)] == [f"{who} print {i}" for i in range(300)]
        (long,) = [m for m in records if m.startswith("x")]
        assert long == "x" * 2048 + " [cut]"


def test_outside_a_launch_the_process_is_rank_0_and_the_root_logger_is_untouched(caplog):
    root_level = logging.getLogger().level
    logger = get_logger("kernel.side", log_level="DEBUG")
    with caplog.at_level(logging.DEBUG, logger="kernel.side"):
        logger.debug("in the kernel")
        logger.info("everyone", main_process_only=False, in_order=True)
    assert [r.getMessage() for r in caplog.records] == ["in the kernel", "everyone"]
    assert logging.getLogger().level == root_level
    assert caplog.records[0].funcName == "test_outside_a_launch_the_process_is_rank_0_and_the_root_logger_is_untouched"


def test_a_copied_or_pickled_logger_logs_through_its_own_logger_after_the_original_was_used(caplog):
    import copy
    import pickle

    original = get_logger("first", log_level="INFO")
    original.info("from the original")  # (its level methods are now kept on it)
    copied = copy.copy(original)
    copied.logger = logging.getLogger("second")
    restored = pickle.loads(pickle.dumps(original))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        copied.info("from the copy")
        restored.warning("from the pickle")
        original.info("the original again")
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        ("second", "from the copy"), ("first", "from the pickle"), ("first", "the original again")]


@pytest.mark.processes
def test_under_torchrun_the_rank_comes_from_the_environment(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import logging, sys
        logging.basicConfig(stream=sys.stdout, format="%(message)s")
        from notebook_launcher import get_logger
        logger = get_logger("script", log_level="INFO")
        logger.info("main only")
        logger.info("every rank", main_process_only=False)
    """))
    completed = run_torchrun(script)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines.count("main only") == 1
    assert lines.count("every rank") == 2


def test_local_main_process_only_logs_once_per_node(monkeypatch, caplog):
    """Rank 2 is local rank 0 of the second node (2 processes per node), as torchrun or a launch would set it."""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    logger = get_logger("nodes", log_level="INFO")
    with caplog.at_level(logging.INFO, logger="nodes"):
        logger.info("global main only")
        logger.info("once per node", local_main_process_only=True)
    assert [r.getMessage() for r in caplog.records] == ["once per node"]
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nodes"):
        logger.info("once per node", local_main_process_only=True)
    assert caplog.records == []


def test_a_wrong_accelerate_log_level_is_named(monkeypatch):
    monkeypatch.setenv("ACCELERATE_LOG_LEVEL", "loud")
    with pytest.raises(ValueError, match="ACCELERATE_LOG_LEVEL is 'loud', which is not a logging level"):
        get_logger("badlevel")


def only_our_handler():
    """In a worker forked from pytest, the root logger also has pytest's capture handlers; a notebook's has none."""
    root = logging.getLogger()
    root.handlers = [handler for handler in root.handlers if type(handler).__name__ == "EventLogHandler"]


def handlers_and_filters(path):
    import sys

    from notebook_launcher.rank import logging as nl_logging

    only_our_handler()
    logger = get_logger("configured", log_level="INFO")
    shortcut = [nl_logging._only_event_handler(logger.logger)]
    logger.info("plain", main_process_only=False)
    logger.logger.addFilter(lambda record: "secret" not in str(record.msg))
    shortcut.append(nl_logging._only_event_handler(logger.logger))
    logger.info("a secret", main_process_only=False)
    logger.info("after the filter", main_process_only=False)
    own = logging.FileHandler(f"{path}.{os.environ['RANK']}")
    logger.logger.addHandler(own)
    logger.info("to both", main_process_only=False)
    logger.logger.removeHandler(own)
    own.close()
    logger.logger.filters.clear()
    shortcut.append(nl_logging._only_event_handler(logger.logger))
    logger.info("%s again", "plain", main_process_only=False)
    logger.warning_once("once", main_process_only=False)
    print("a", 2, None, sep="-", end="!\n")
    print("to stderr", file=sys.stderr)
    print("one", end="")
    print(" line")
    return shortcut


@pytest.mark.processes
def test_handlers_and_filters_the_user_adds_in_a_worker_are_honoured(tmp_path):
    """A record only our handler would see takes a shorter way than logging's; what the user configures applies."""
    notebook_launcher(handlers_and_filters, args=(str(tmp_path / "own.log"),), num_processes=2, device="cpu")
    source_lines = open(__file__).read().splitlines()
    for rank in (0, 1):
        assert last_run().results[rank] == [True, False, True]
        records = [e.data for e in last_run().events if e.kind == "log" and e.rank == rank]
        assert [r["message"] for r in records] == ["plain", "after the filter", "to both", "plain again", "once"]
        assert {(r["file"], r["function"], r["logger"], r["level"]) for r in records} == {
            (__file__, "handlers_and_filters", "configured", level) for level in ("INFO", "WARNING")}
        for record in records:  # each one's own line, whichever way it went
            line = source_lines[record["line"] - 1]
            assert "logger." in line and record["message"].split()[-1] in line
        assert open(tmp_path / f"own.log.{rank}").read() == "to both\n"
        assert last_run().output(rank=rank, stream="stdout")[-2:] == ["a-2-None!", "one line"]
        assert "to stderr" in last_run().output(rank=rank, stream="stderr")
