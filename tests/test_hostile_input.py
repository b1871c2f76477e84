"""Hostile or careless input on the kernel's side: refused before any process starts, or survived with the true
cause shown and nothing left behind. Real processes throughout."""

import marshal
import os
import random
import resource
import signal
import struct
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
import torch
from helpers.processes import no_children_left

from notebook_launcher import LaunchArgumentError, RankFailedError, ResultUnavailableError, last_run, notebook_launcher
from notebook_launcher.schema.decoding import FrameDecoder, LineSplitter
from notebook_launcher.schema.events import encode_frame
from notebook_launcher.schema.results import SMALL_RESULT_BYTES, pack_result, result_sinks, unpack_result
from notebook_launcher.schema.runlog import KEEP_RUNS, PRUNE_MIN_AGE_S, RunLog


def returns_rank():
    import torch.distributed as dist

    return dist.get_rank()


# -- 2: pruning ---------------------------------------------------------------------------------------------------
@pytest.mark.processes
def test_pruning_keeps_the_current_run_when_fifty_folders_sort_after_now(runs_dir):
    runs_dir.mkdir(parents=True)
    old = time.time() - 2 * PRUNE_MIN_AGE_S
    for index in range(KEEP_RUNS + 5):  # stamped in the future (another time zone, a clock set back), finished
        folder = runs_dir / f"29990101-000000-{100000 + index}-abcdef"
        folder.mkdir()
        (folder / "run.json").write_text("{}")
        os.utime(folder / "run.json", (old + index, old + index))
        os.utime(folder, (old + index, old + index))
    assert notebook_launcher(returns_rank, num_processes=2, device="cpu") == 0
    assert os.path.isdir(last_run().run_dir)
    assert notebook_launcher(returns_rank, num_processes=2, device="cpu") == 0  # and the next launch too
    left = sorted(path.name for path in runs_dir.iterdir())
    assert os.path.basename(last_run().run_dir) in left
    assert len([name for name in left if name.startswith("2999")]) == KEEP_RUNS  # the oldest five went


def test_pruning_spares_young_folders_and_runs_whose_kernel_is_alive(runs_dir):
    runs_dir.mkdir(parents=True)
    old = time.time() - 2 * PRUNE_MIN_AGE_S
    in_progress = runs_dir / f"20000101-000000-{os.getpid()}-000001"  # no summary yet, its kernel (we) alive
    in_progress.mkdir()
    os.utime(in_progress, (old - 100, old - 100))
    young = runs_dir / "20000101-000000-1-000002"
    young.mkdir()
    for index in range(KEEP_RUNS + 3):
        folder = runs_dir / f"20000102-000000-{100000 + index}-abcdef"
        folder.mkdir()
        (folder / "run.json").write_text("{}")
        os.utime(folder / "run.json", (old + index, old + index))
        os.utime(folder, (old + index, old + index))
    log = RunLog(str(runs_dir))
    log.close()
    assert in_progress.is_dir() and young.is_dir() and os.path.isdir(log.path)
    assert len(list(runs_dir.glob("20000102-*"))) == KEEP_RUNS


# -- 9: the run log folder ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["a file", "/proc"])
@pytest.mark.processes
def test_an_unusable_runs_dir_is_named_with_the_fix(where, tmp_path, monkeypatch):
    if where == "a file":
        target = tmp_path / "not-a-folder"
        target.write_text("x")
    else:
        target = "/proc/notebook_launcher_runs"  # not writable, even as root
    monkeypatch.setenv("NOTEBOOK_LAUNCHER_RUNS_DIR", str(target))
    with pytest.raises(OSError, match="set NOTEBOOK_LAUNCHER_RUNS_DIR to a folder you can write to") as caught:
        notebook_launcher(returns_rank, num_processes=2, device="cpu")
    assert str(target) in str(caught.value)
    no_children_left()


# -- 4, 5, 8: arguments checked before anything starts --------------------------------------------------------------
@pytest.mark.processes
def test_a_master_addr_that_does_not_resolve_is_refused_at_once():
    started = time.monotonic()
    with pytest.raises(LaunchArgumentError, match=r"master_addr: the host 'not a host' cannot be resolved"):
        notebook_launcher(returns_rank, num_processes=2, device="cpu", master_addr="not a host", timeout=30)
    assert time.monotonic() - started < 10
    no_children_left()


@pytest.mark.processes
def test_more_cpu_ranks_than_the_machine_can_hold_are_refused_with_the_number():
    cores = len(os.sched_getaffinity(0))
    with pytest.raises(LaunchArgumentError, match=rf"num_processes=10000 is more than 8 ranks per CPU core .*"
                                                  rf"\({cores} core\(s\), so at most {cores * 8}\)"):
        notebook_launcher(returns_rank, num_processes=10_000, device="cpu")
    no_children_left()


@pytest.mark.processes
def test_ranks_beyond_the_open_file_limit_are_refused_with_the_fix():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (80, hard))
    try:
        with pytest.raises(LaunchArgumentError, match=r"num_processes=4 needs about 96 open files .* limit of 80.*"
                                                      r"ulimit -n 96"):
            notebook_launcher(returns_rank, num_processes=4, device="cpu")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    no_children_left()


@pytest.mark.parametrize("value", [1e9, 61])
@pytest.mark.processes
def test_a_monitor_interval_over_a_minute_is_refused(value):
    with pytest.raises(LaunchArgumentError, match=r"monitor_interval=.* s is longer than 60 s"):
        notebook_launcher(returns_rank, num_processes=2, device="cpu", monitor_interval=value)
    no_children_left()


@pytest.mark.processes
def test_a_display_class_instead_of_an_instance_is_refused_before_any_worker_starts(runs_dir):
    from notebook_launcher.display import TextDisplay

    with pytest.raises(LaunchArgumentError, match=r"display=TextDisplay is a class: pass an instance, "
                                                  r"display=TextDisplay\(\.\.\.\), or one of 'auto', 'panel', 'text'"):
        notebook_launcher(returns_rank, num_processes=2, device="cpu", display=TextDisplay)
    assert not runs_dir.exists() or not list(runs_dir.iterdir())  # nothing started, nothing logged
    no_children_left()


@pytest.mark.parametrize("value", [2**70, "99999999999999999999TB", "9" * 400 + "GB"])
@pytest.mark.processes
def test_a_memory_limit_beyond_the_machine_is_refused_naming_its_memory(value):
    with pytest.raises(LaunchArgumentError, match=r"memory_limit=.* is more than this machine's memory \([0-9.]+ "
                                                  r"GiB of RAM and swap\), so it would limit nothing: give at most"):
        notebook_launcher(returns_rank, num_processes=2, device="cpu", memory_limit=value)
    no_children_left()


# -- 6: a corrupt event stream ------------------------------------------------------------------------------------
def write_on_the_event_pipe(garbage: bytes):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        print("the last line before the garbage")
        os.write(sys.stdout._channel.fd, garbage)  # what a stray os.write to the wrong fd does
        print("printed after it, on the event pipe: lost")
        time.sleep(30)
    dist.barrier()


def raw_frame(header) -> bytes:
    encoded = marshal.dumps(header)
    return struct.pack(">II", len(encoded), 0) + encoded


GARBAGE = {
    "huge header length": struct.pack(">II", 2**31, 0) + b"x" * 64,
    "not marshal": struct.pack(">II", 5, 0) + b"\xff\xfe\xfd\xfc\xfb",
    "header is a list": raw_frame([1, 2, 3]),
    "data is an int": raw_frame({"rank": 1, "seq": 1, "time": 0.0, "kind": "log", "data": 12}),
    "attachment on a log": encode_frame(1, 9, "log", {"message": "x"}, b"abc"),
    "a negative pickle length": encode_frame(1, 9, "result", {"pickle_bytes": -1, "storages": [11]}, b"x" * 10),
    "an exit only the kernel makes": encode_frame(1, 9, "exit", {"exit_code": 0}),
    "a NaN time": raw_frame({"rank": 1, "seq": 1, "time": float("nan"), "kind": "log", "data": {"message": "x"}}),
    "a kind of no event": encode_frame(1, 9, "no_such_kind", {"text": "x"}),
}


@pytest.mark.parametrize("name", list(GARBAGE))
@pytest.mark.processes
def test_a_corrupt_frame_fails_that_rank_clearly_and_keeps_every_line_before_it(name):
    started = time.monotonic()
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(write_on_the_event_pipe, args=(GARBAGE[name],), num_processes=2, device="cpu")
    assert str(caught.value).startswith("Rank 1 failed first: CorruptEventStream: rank 1 wrote bytes on its event "
                                        "pipe that are not an event")
    assert "the last line before the garbage" in last_run().output(rank=1)
    assert time.monotonic() - started < 20  # stopped at once, not after the rank's 30 s sleep
    no_children_left()


def emits_data_json_cannot_hold():
    import torch.distributed as dist

    print("before the frame")
    sys.stdout._channel.emit("progress", {"step": 1, (1, 2): {3: "three"}})  # keys JSON cannot hold
    dist.barrier()
    return "fine"


@pytest.mark.processes
def test_an_event_whose_data_json_cannot_hold_fails_that_rank_clearly_and_the_run_log_stays_json():
    with pytest.raises(RankFailedError, match=r"CorruptEventStream: rank \d wrote bytes on its event pipe that are "
                                              r"not an event \(a 'progress' event whose data has a key that is not "
                                              r"a str\)"):
        notebook_launcher(emits_data_json_cannot_hold, num_processes=2, device="cpu", display="panel")
    from notebook_launcher.schema.runlog import read_run_log

    events = list(read_run_log(last_run().run_dir))
    assert not [event for event in events if event["kind"] == "progress"]
    assert "before the frame" in [event["data"].get("text") for event in events if event["kind"] == "stream"]
    no_children_left()


def test_the_decoder_survives_random_bytes_and_random_valid_looking_frames():
    """Whatever arrives, the decoder returns checked frames and at worst says the stream is broken; it never
    raises."""
    rng = random.Random(1234)
    valid = [encode_frame(0, i, "log", {"message": "m" * i}) for i in range(20)]
    for trial in range(3000):
        stream = bytearray(b"".join(rng.sample(valid, 5)))
        for _ in range(rng.randint(1, 4)):  # flip, cut or insert bytes anywhere, lengths included
            at = rng.randrange(len(stream))
            choice = rng.random()
            if choice < 0.4:
                stream[at] = rng.randrange(256)
            elif choice < 0.7:
                stream[at:at] = os.urandom(rng.randint(1, 16))
            else:
                del stream[at:at + rng.randint(1, 16)]
        if trial % 3 == 0:
            stream = bytearray(os.urandom(rng.randint(1, 400)))
        decoder = FrameDecoder(result_sinks)
        for start in range(0, len(stream), 37):
            for header, _ in decoder.feed(bytes(stream[start:start + 37])):
                assert isinstance(header["data"], dict) and isinstance(header["kind"], str)
                assert isinstance(header["rank"], int) and isinstance(header["seq"], int)
        if decoder.broken:
            assert decoder.feed(valid[0]) == []  # nothing after a bad frame is trusted
    assert FrameDecoder().feed(b"".join(valid)) == [FrameDecoder().feed(frame)[0] for frame in valid]


# -- 10: a result that cannot come back ---------------------------------------------------------------------------
def returns_a_worker_only_class():
    class OnlyHere:  # pickled by value with cloudpickle; its __reduce__ refers to a module the kernel lacks
        def __reduce__(self):
            return (__import__, ("a_module_only_the_worker_has",))

    return OnlyHere()


@pytest.mark.processes
def test_a_result_that_cannot_be_rebuilt_raises_with_the_rank_the_type_and_the_reason():
    with pytest.raises(ResultUnavailableError) as caught:
        notebook_launcher(returns_a_worker_only_class, num_processes=2, device="cpu")
    error = caught.value
    assert error.rank == 0 and error.type == "OnlyHere"
    assert "ModuleNotFoundError" in error.reason and "a_module_only_the_worker_has" in str(error)
    assert error.run is last_run() and error.run.status == "failed"
    no_children_left()


# -- 11: long lines -----------------------------------------------------------------------------------------------
def prints_long_lines():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print("p" * 200_000)  # through Python
        os.write(1, b"f" * 3_000_000 + b"\n")  # straight to fd 1, as C code would
        print("after")
    dist.barrier()


@pytest.mark.processes
def test_long_lines_arrive_whole_with_no_empty_line_after_them():
    notebook_launcher(prints_long_lines, num_processes=2, device="cpu", display="text")
    lines = last_run().output(rank=0)
    assert lines[-3:] == ["p" * 200_000, "f" * 3_000_000, "after"]


def test_a_line_over_the_bound_is_split_with_a_marker_and_nothing_lost():
    splitter = LineSplitter()
    size = LineSplitter.MAX_LINE_BYTES
    lines = []
    for piece in range(0, 2 * size + 10, 1 << 20):
        lines += splitter.feed(b"x" * min(1 << 20, 2 * size + 10 - piece))
    lines += splitter.feed(b"\nnext\n")
    assert [len(line) for line in lines] == [size + len(LineSplitter.LINE_CONTINUES)] * 2 + [10, 4]
    assert lines[0].endswith(LineSplitter.LINE_CONTINUES) and lines[3] == "next"


# -- 12: escaped descendants --------------------------------------------------------------------------------------
def start_an_escaped_grandchild(pid_file: str, then: str):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        if os.fork() == 0:  # the classic daemon: fork, setsid, fork again, the middle one exits
            os.setsid()
            if os.fork() == 0:
                with open(pid_file + ".part", "w") as out:
                    out.write(str(os.getpid()))
                os.rename(pid_file + ".part", pid_file)
                time.sleep(300)
            while not os.path.exists(pid_file):  # (the middle one waits for it: a process forked in a rank dies
                time.sleep(0.01)  # with its parent, and on a busy machine it could die before it is written)
            os._exit(0)
        while not os.path.exists(pid_file):
            time.sleep(0.01)
        if then == "killed":  # at once: the kernel, a subreaper while ranks run, gets what the rank leaves
            os.kill(os.getpid(), signal.SIGKILL)
        if then == "raises":
            raise RuntimeError("failing with a daemon below")
    dist.barrier()


@pytest.mark.parametrize("then", ["returns", "raises", "killed"])
@pytest.mark.processes
def test_a_double_forked_setsid_grandchild_does_not_outlive_the_run(then, tmp_path):
    pid_file = str(tmp_path / "grandchild.pid")
    if then == "returns":
        notebook_launcher(start_an_escaped_grandchild, args=(pid_file, then), num_processes=2, device="cpu")
    else:
        with pytest.raises(RankFailedError):
            notebook_launcher(start_an_escaped_grandchild, args=(pid_file, then), num_processes=2, device="cpu")
    grandchild = int(open(pid_file).read())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and psutil.pid_exists(grandchild) and \
            psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        time.sleep(0.05)
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    no_children_left()


# -- 13: results and the kernel's memory --------------------------------------------------------------------------
def returns_big(size_bytes: int, who: str):
    import torch.distributed as dist

    if who == "all" or dist.get_rank() == 0:
        return {"weight": torch.ones(size_bytes // 4), "step": 3}
    return dist.get_rank()


def peak_rss_during(call) -> int:
    """The kernel's (this process's) peak resident memory during ``call``, above what it held before."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets the peak (VmHWM) to the current resident size
    before = _status_kb("VmRSS")
    result = call()
    return (_status_kb("VmHWM") - before) * 1024, result


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


@pytest.mark.processes
def test_rank_0s_large_tensor_costs_the_kernel_about_its_size_once():
    size = 256 * 2**20
    peak, result = peak_rss_during(lambda: notebook_launcher(returns_big, args=(size, "rank0"), num_processes=2,
                                                             device="cpu", display="text"))
    assert result["step"] == 3 and result["weight"].shape == (size // 4,) and bool(result["weight"].eq(1).all())
    assert peak <= 1.5 * size, f"the kernel peaked {peak / size:.2f}x the result's size"


@pytest.mark.processes
def test_other_ranks_large_results_stay_behind_unless_asked_for():
    size = SMALL_RESULT_BYTES + 2**20
    notebook_launcher(returns_big, args=(size, "all"), num_processes=2, device="cpu")
    run = last_run()
    assert set(run.results) == {0} and "larger than 64 MB" in run.results_left_out[1]
    notebook_launcher(returns_big, args=(size, "all"), num_processes=2, device="cpu", results="all")
    assert set(last_run().results) == {0, 1} and last_run().results[1]["weight"].numel() == size // 4
    notebook_launcher(returns_rank, num_processes=2, device="cpu", results="rank0")
    assert last_run().results == {0: 0} and last_run().results_left_out == {1: "results='rank0'"}


def test_results_keep_views_dtypes_and_metadata():
    base = torch.arange(12, dtype=torch.float64)
    value = {"state": torch.nn.Linear(3, 2).state_dict(), "base": base, "view": base[3:6], "half": base.half(),
             "text": "ok"}
    data, parts = pack_result(value, 0, "auto")
    attachment = b"".join(bytes(part) for part in parts)
    decoder = FrameDecoder(result_sinks)
    [(header, received)] = decoder.feed(encode_frame(0, 1, "result", data, attachment))
    back = unpack_result(header["data"], received)
    assert back["view"].tolist() == [3.0, 4.0, 5.0] and back["half"].dtype == torch.float16
    assert back["view"].untyped_storage().data_ptr() == back["base"].untyped_storage().data_ptr()
    assert back["state"]._metadata == value["state"]._metadata and back["text"] == "ok"
    assert unpack_result(data, attachment)["base"].tolist() == base.tolist()  # as one buffer (an agent's)


# -- cells named in what a rank sends: linear in its length --------------------------------------------------------
@pytest.mark.processes
def test_naming_cells_in_a_megabyte_of_hostile_text_takes_one_pass():
    """An exception's message is the rank's to choose: a megabyte of path characters, or of `File "`, once made the
    kernel's cell naming quadratic (minutes). In a fresh process with IPython loaded (where naming runs), with a
    bound a thousand times what one linear pass takes here."""
    code = textwrap.dedent("""
        import IPython
        from notebook_launcher.schema.cells import cell_names
        for text in ["h" * 1_000_000, 'File "' * 200_000, "a.py" * 250_000, "x " * 500_000]:
            assert cell_names(text) == text
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
