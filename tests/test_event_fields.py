"""Every field of every kind of event a rank sends, of the wrong shape (wrong type, missing, NaN or infinite,
huge, nested, keys JSON cannot hold), written on a real rank's event pipe: the launch ends as one
CorruptEventStream failure of that rank naming the kind and the field, with the lines before it kept, or, where
the table allows the value, goes on; never a raw error of the kernel's, with the text display or the panel."""

import json
import math
import random
import sys
import time

import psutil
import pytest

from notebook_launcher import RankFailedError, ResultUnavailableError, last_run, notebook_launcher
from notebook_launcher.schema.events import DATA_SCHEMA, NUMBER, Fields, ListOf, MapOf, OneOf, encode_frame
from notebook_launcher.supervision.demux import RankDemux

# what a rank really sends, one event of each kind, every field of the table present
VALID = {
    "status": {"state": "running", "pid": 4242, "local_rank": 1, "exit_code": None, "host": "here",
               "thread": "MainThread"},
    "output": {"stream": "stdout", "text": "crafted output\n"},
    "result": {"type": "int", "bytes": 0, "attachment_bytes": 0, "pickle_bytes": 0, "storages": [],
               "kept": False, "reason": "crafted"},
    "failure": {"type": "CraftedError", "module": "crafted", "message": "crafted failure",
                "traceback": "Traceback (most recent call last):\n  crafted", "exit_code": 1,
                "all_ranks_raise": False, "oom_retry": None},
    "log": {"level": "INFO", "levelno": 20, "logger": "crafted", "message": "crafted record", "file": "f.py",
            "line": 3, "function": "f", "created": 1.5, "exc_text": "Traceback: crafted", "stack": None},
    "shape_mismatch": {"operation": "all_reduce", "operations": ["all_reduce", "all_reduce"], "shapes": [[2], [3]],
                       "dtypes": ["float32", "float32"], "call_sites": ["a.py:1 in f", "b.py:2 in g"],
                       "message": "crafted mismatch"},
    "trigger": {"call_site": "a.py:1 in f"},
    "batch_size": {"key": "crafted", "batch_size": 8},
    "progress": {"step": 1, "total": 10, "metrics": {"loss": 0.5, "acc": "nan"}},
    "balance": {"elapsed": 1.0, "waited": 0.25, "steps": [[1, 0.5, 0.1], [2, 0.9, 0.2, None]],
                "step_source": "report", "final": False, "peak_rss": 1000, "cuda": None},
    "display": {"op": "display", "display_id": "crafted", "wait": False, "omitted": ["text/html"], "bytes": 9,
                "data": {"text/plain": "'crafted'"}, "metadata": {}},
    "text_escaped": {"route": "log"},
}
NAN = float("nan")
WRONG = [7, 2.5, "text", True, None, [1, 2], {"a": 1}, (1, 2)]
ODD = {"NaN": NAN, "inf": float("inf"), "-inf": -float("inf"), "int over 64 bits": 2**70,
       "nested 70 deep": None, "key that is a tuple": {(1, 2): 3}}


def nested(depth):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


def huge_for(spec):
    """A value at (or past) the size the field's type allows."""
    if spec is str or (type(spec) is tuple and str in spec):
        return "h" * 1_000_000
    if spec is int or spec is NUMBER or (type(spec) is tuple and (int in spec or NUMBER in spec)):
        return 2**63 - 1
    if type(spec) is ListOf or (type(spec) is tuple and any(type(each) is ListOf for each in spec)):
        return [None] * 70_000
    if type(spec) is MapOf or (type(spec) is tuple and any(type(each) is MapOf for each in spec)):
        return {f"m{index}": 1 for index in range(5000)}
    return 1e308


def shapes_of(spec) -> set:
    """The Python types a value of ``spec`` may be, at its top (the test's reading of the table)."""
    if type(spec) is tuple:
        return set().union(*(shapes_of(each) for each in spec))
    return {NUMBER: {int, float}, None: {type(None)}}.get(spec) if spec is NUMBER or spec is None else \
        {spec} if type(spec) is type else {list, tuple} if type(spec) is ListOf else \
        {dict} if type(spec) in (MapOf, Fields) else {str} if type(spec) is OneOf else set()


def mutations():
    """(kind, field, what, data, must_refuse) for every field of every kind; must_refuse: the table cannot
    allow it (a required field missing, a type the field cannot have, NaN or an infinity, beyond 64 bits, too
    deep, a key JSON cannot hold)."""
    for kind, table in DATA_SCHEMA.items():
        for field, spec in table.types.items():
            base = dict(VALID[kind])
            if field in base:
                data = {key: value for key, value in base.items() if key != field}
                yield kind, field, "missing", data, field in table.required
            for value in WRONG:
                if type(value) not in shapes_of(spec):
                    yield kind, field, f"a {type(value).__name__}", {**base, field: value}, True
            if type(spec) is OneOf:
                yield kind, field, "a str of no choice", {**base, field: "text"}, True
            for what, value in ODD.items():
                value = nested(70) if what == "nested 70 deep" else value
                yield kind, field, what, {**base, field: value}, True
            yield kind, field, "huge", {**base, field: huge_for(spec)}, None  # refused only past a bound


def sends_a_crafted_event(kind, data):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        print("before the frame")
        sys.stdout._channel.emit(kind, data)
        print("after the frame")
    dist.barrier()
    return "fine"


def not_json(name):
    raise AssertionError(f"{name} in the run log")


def launch_one(kind, data, display):
    """The launch's outcome: "fine", or the first line of the error it raised (of the types a user expects)."""
    try:
        return notebook_launcher(sends_a_crafted_event, args=(kind, data), num_processes=2, device="cpu",
                                 display=display, timeout=60)
    except (RankFailedError, ResultUnavailableError) as error:
        return error


def test_every_field_of_every_kind_of_the_wrong_shape_is_refused_by_the_kernels_reader_naming_it():
    """All of them (about 800), through the reader of a rank's pipes: the ones the table cannot allow are one
    CorruptEventStream failure naming the kind and the field; nothing raises."""
    cases = list(mutations())
    assert len(cases) > 600 and {case[0] for case in cases} == set(DATA_SCHEMA)
    refused = 0
    for kind, field, what, data, must_refuse in cases:
        demux = RankDemux(1)
        got = list(demux.feed("events", encode_frame(1, 1, kind, data)))
        failures = [item for item in got if type(item) is not list and item.kind == "failure"
                    and item.data["type"] == "CorruptEventStream"]
        if must_refuse:
            assert len(failures) == 1, (kind, field, what)
        if failures:
            message = failures[0].data["message"]
            assert f"(a '{kind}' event " in message and f"'{field}" in message, (kind, field, what, message)
            refused += 1
    assert refused > 600


@pytest.mark.processes
def test_every_field_of_every_kind_of_the_wrong_shape_fails_the_rank_clearly_or_is_harmless(capsys):
    """In real launches, text and panel: every value the tables may let through (to the attempts, the failure
    tracker, the displays, the run log), and every fourth of the ones they refuse."""
    every = list(mutations())
    cases = [case for case in every if case[4] is not True] + [case for case in every if case[4] is True][::4]
    started = time.monotonic()
    found = {"refused": 0, "accepted": 0}
    for index, (kind, field, what, data, must_refuse) in enumerate(cases):
        display = "text" if index % 2 else "panel"
        outcome = launch_one(kind, data, display)
        said = f"{kind}.{field} {what} ({display}): {str(outcome)[:600]}"
        run = last_run()
        if isinstance(outcome, RankFailedError) and "CorruptEventStream" in str(outcome).splitlines()[0]:
            headline = str(outcome).splitlines()[0]
            assert headline.startswith("Rank 1 failed first: CorruptEventStream: rank 1 wrote bytes on its event "
                                       f"pipe that are not an event (a '{kind}' event "), said
            assert f"'{field}" in headline, said  # the field, or the item of it, that is wrong
            assert "before the frame" in run.output(rank=1) and "after the frame" not in run.output(rank=1), said
            found["refused"] += 1
        else:
            assert not must_refuse, said
            assert outcome == "fine" or kind == "failure" and isinstance(outcome, RankFailedError) and \
                str(outcome).startswith("Rank 1 failed first: ") or \
                kind == "result" and isinstance(outcome, ResultUnavailableError), said
            found["accepted"] += 1
        assert run.status in ("finished", "failed"), said
        if display == "panel":
            assert run.panel_state is not None, said
        for line in open(f"{run.run_dir}/events.jsonl"):  # the run log: strict JSON, whatever the rank sent
            json.loads(line, parse_constant=not_json)
        capsys.readouterr()
    assert psutil.Process().children(recursive=True) == []
    assert found["refused"] > 150 and found["accepted"] > 60, found
    assert time.monotonic() - started < 150, found


@pytest.mark.processes
def test_the_cases_found_by_hand_each_name_their_kind_and_field():
    cases = {
        ("batch_size", "'batch_size'"): {"key": "k"},
        ("failure", "'traceback' is 5"): {"type": "X", "message": "m", "traceback": 5},
        ("failure", "'oom_retry.key'"): {"type": "X", "message": "m", "oom_retry": {"a": 1}},
        ("status", "'state' is 3"): {"state": 3},
        ("no_such_kind", "no event has that kind"): {(1, 2): 3},
        ("progress", "'metrics' is a list"): {"metrics": [1, 2]},
        ("progress", "'step' is '1'"): {"step": "1"},
        ("shape_mismatch", "'operations' is a dict"): {"message": "m", "operations": {"a": 1}},
        ("progress", "'metrics[loss]' is nan"): {"metrics": {"loss": NAN}},
    }
    for (kind, named), data in cases.items():
        outcome = launch_one(kind, data, "text")
        assert isinstance(outcome, RankFailedError), (kind, outcome)
        assert f"(a '{kind}' event" in str(outcome) and named in str(outcome).splitlines()[0], (kind, outcome)
    assert psutil.Process().children(recursive=True) == []


@pytest.mark.processes
def test_what_a_rank_really_sends_passes_the_tables():
    """The valid events above pass (a launch of each): the tables accept what the workers send."""
    rng = random.Random(5)
    for kind in rng.sample([kind for kind in VALID if kind not in ("failure", "result")], 5):
        assert launch_one(kind, VALID[kind], "panel") == "fine", kind
    assert math.isnan(NAN)
