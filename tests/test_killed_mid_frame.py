"""A rank killed while it writes a frame (the out-of-memory killer while it sends its state_dict) is a
RankFailedError naming the signal, never an error of the kernel's own; nothing is left behind. Real processes.
The result goes through the pipe here (as from another host, or where the kernel's in-memory file cannot be
written); a rank killed while it writes that file is tests/test_results_in_memory.py's."""

import os
import random
import resource
import signal
import threading
import time

import psutil
import pytest
import torch

from notebook_launcher import RankFailedError, last_run, notebook_launcher

pytestmark = pytest.mark.processes

PARTS = 48  # 1 MB tensors: the rank writes one storage after the other, so a kill can land between any two
PART_BYTES = 1 << 20


def killed_after_writing(target_bytes: int, after_s: float):
    """Rank 0 returns 48 MB and is SIGKILLed once it has written ``target_bytes`` more (or after ``after_s``)."""
    import torch.distributed as dist

    if dist.get_rank() != 0:
        return 1
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the in-memory file refused past 1 MB (EFBIG): the pipe
    resource.setrlimit(resource.RLIMIT_FSIZE, (PART_BYTES, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    value = [torch.full((PART_BYTES // 4,), float(index)) for index in range(PARTS)]

    def written() -> int:
        with open("/proc/self/io") as io:
            return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))

    def kill_later():
        start = written()
        deadline = time.monotonic() + after_s
        while written() - start < target_bytes and time.monotonic() < deadline:
            time.sleep(0.0005)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=kill_later, daemon=True).start()
    return value


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_ranks_killed_at_random_points_of_a_large_result_fail_with_their_signal(capsys):
    rng = random.Random(27)
    notebook_launcher(killed_after_writing, args=(1 << 40, 10.0), num_processes=2, device="cpu", display="text")
    fds_before = open_fds()  # (after a first launch: what the process opens once and keeps is no leak)
    outcomes = {"killed mid-frame": 0, "killed otherwise": 0, "finished": 0}
    started = time.monotonic()
    for trial in range(30):
        if trial % 5 == 4:  # by time alone: before the result, while it is sent, or once it is sent
            target, after = 1 << 40, rng.uniform(0.0, 0.3)
        else:  # after a random number of bytes of the frame (its header, a storage, between two)
            target, after = rng.randrange(int(PARTS * PART_BYTES * 1.05)), 10.0
        try:
            value = notebook_launcher(killed_after_writing, args=(target, after), num_processes=2, device="cpu",
                                      display="text", timeout=60)
        except RankFailedError as error:
            headline = str(error).splitlines()[0]
            assert headline.startswith("Rank 0 failed first: killed by SIGKILL"), str(error)
            truncated = [event for event in last_run().events if event.kind == "failure"
                         and event.data["type"] == "TruncatedEvent"]
            assert len(truncated) <= 1
            outcomes["killed mid-frame" if truncated else "killed otherwise"] += 1
        else:  # the kill came too late: the result is whole
            assert len(value) == PARTS and all(bool(part.eq(index).all()) for index, part in enumerate(value))
            outcomes["finished"] += 1
        shown = capsys.readouterr()
        assert (shown.out + shown.err).count("unfinished event") <= 1  # the truncated frame is told once
        assert psutil.Process().children(recursive=True) == []
    assert open_fds() == fds_before
    assert outcomes["killed mid-frame"] >= 5, outcomes  # most kills land inside the frame
    assert time.monotonic() - started < 100, outcomes
