"""The runs folder is a record, never a reason to lose a run: on a real full disk (a small tmpfs, a loop-mounted
ext4) or a failing one (ext4 shut down: every call an I/O error), before the launch or in the middle of it, the
run finishes with rank 0's result, its status and exit codes, and one warning that its log is incomplete; the
kernel and the ranks never fault on a mapped page (the progress records live in memory).

Mounting needs root: without it (or where mount is refused) these tests skip and say so.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess

import pytest
from helpers.kernel import _assert_ok, _panel, _result, run_cell, running_kernel
from helpers.processes import no_children_left

from notebook_launcher import last_run, notebook_launcher
from notebook_launcher.schema.runlog import read_run_log

WARNING = "is incomplete"
EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32): the filesystem fails every call from now on, with EIO
EXT4_GOING_FLAGS_NOLOGFLUSH = 2


def mount(kind: str, tmp_path) -> str:
    """A 4 MB tmpfs or a 16 MB ext4 (a loop device) at tmp_path/disk."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root, and these tests do not run as root")
    where = tmp_path / "disk"
    where.mkdir()
    if kind == "tmpfs":
        command = ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(where)]
    else:
        image = tmp_path / "disk.img"
        with open(image, "wb") as out:
            out.truncate(16 * 2**20)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True, timeout=60)
        command = ["mount", "-o", "loop", str(image), str(where)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.skip(f"mount is not permitted here: {done.stderr.strip()}")
    return str(where)


@pytest.fixture(params=["tmpfs", "ext4"])
def disk(request, tmp_path, monkeypatch):
    """The runs folder on a small filesystem of its own (NOTEBOOK_LAUNCHER_RUNS_DIR), unmounted after the test."""
    where = mount(request.param, tmp_path)
    try:
        runs = os.path.join(where, "runs")
        os.mkdir(runs)
        monkeypatch.setenv("NOTEBOOK_LAUNCHER_RUNS_DIR", runs)
        yield where
    finally:
        subprocess.run(["umount", where], check=True, timeout=60)
    assert not os.path.ismount(where)


def fill(folder: str) -> None:
    """Writes a file in ``folder`` until its disk is full: ENOSPC for a write of even one byte."""
    with open(os.path.join(folder, "filler"), "wb", buffering=0) as out:
        chunk = 2**20
        while chunk:
            try:
                out.write(bytes(chunk))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                chunk //= 2
    with pytest.raises(OSError) as refused:
        with open(os.path.join(folder, "filler"), "ab", buffering=0) as out:
            out.write(b"x")
    assert refused.value.errno == errno.ENOSPC


def reduces_and_returns(fill_disk_at: str = "", shut_down: str = "", lines: int = 0):
    """Three all_reduces (each writes the rank's progress record) around what the case does to the runs folder's
    disk on rank 0: fill it, or shut it down (every call an I/O error), then print ``lines`` lines."""
    import torch
    import torch.distributed as dist

    total = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        if fill_disk_at:
            fill(fill_disk_at)
        if shut_down:
            descriptor = os.open(shut_down, os.O_RDONLY)
            try:
                fcntl.ioctl(descriptor, EXT4_IOC_SHUTDOWN, EXT4_GOING_FLAGS_NOLOGFLUSH.to_bytes(4, "little"))
            finally:
                os.close(descriptor)
        for number in range(lines):
            print(f"line {number} " + "x" * 100)
    dist.all_reduce(total)
    dist.all_reduce(total)
    print(f"done {dist.get_rank()}")
    return total.item()


def assert_finished_with_one_warning(result, out: str) -> None:
    run = last_run()
    assert result == 12.0
    assert run.status == "finished" and run.exit_codes == {0: 0, 1: 0}
    assert {"done 0", "done 1"} <= set(run.output())
    assert out.count(WARNING) == 1, out
    no_children_left()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.processes
def test_a_disk_full_before_the_launch_gives_the_result_and_one_warning(disk, start_method, capsys):
    fill(disk)
    result = notebook_launcher(reduces_and_returns, num_processes=2, device="cpu", start_method=start_method,
                               display="text")
    assert_finished_with_one_warning(result, capsys.readouterr().out)


@pytest.mark.processes
def test_a_disk_that_fills_mid_run_gives_the_result_and_one_warning(disk, capsys):
    result = notebook_launcher(reduces_and_returns, args=(disk, "", 3000), num_processes=2, device="cpu",
                               display="text")
    out = capsys.readouterr().out
    assert_finished_with_one_warning(result, out)
    assert "line 2999 " in out  # shown whole, though the log could not keep it
    kept = read_run_log(last_run().run_dir)  # what reached the disk before it filled reads back as records
    assert all(record["rank"] in (-1, 0, 1) for record in kept)


@pytest.mark.parametrize("disk", ["ext4"], indirect=True)
@pytest.mark.processes
def test_a_disk_failing_mid_run_with_io_errors_gives_the_result_and_one_warning(disk, capsys):
    result = notebook_launcher(reduces_and_returns, args=("", disk, 3000), num_processes=2, device="cpu",
                               display="text")
    out = capsys.readouterr().out
    assert_finished_with_one_warning(result, out)
    assert "Input/output error" in out.split(WARNING)[1].splitlines()[0]
    assert last_run().result(0) == 12.0


FULL_DISK_CELL = """\
from notebook_launcher import last_run, notebook_launcher

def train():
    import torch, torch.distributed as dist
    total = torch.ones(1) * (dist.get_rank() + 1)
    for _ in range(3):
        dist.all_reduce(total)
    return total.item()

notebook_launcher(train, num_processes=2, device="cpu")
"""


@pytest.mark.parametrize("disk", ["tmpfs"], indirect=True)
@pytest.mark.processes
@pytest.mark.kernel
def test_in_a_kernel_a_full_runs_folder_leaves_the_kernel_alive_and_returns_the_result(disk, tmp_path):
    fill(disk)
    with running_kernel(tmp_path) as (_, kc, kernel):
        reply, outputs = run_cell(kc, FULL_DISK_CELL, timeout=120)
        _assert_ok(reply, outputs)
        assert _result(outputs) == "12.0"
        panel = _panel(outputs)
        assert panel["status"] == "finished"
        assert len([note for note in panel["notes"] if WARNING in note]) == 1, panel["notes"]
        reply, outputs = run_cell(kc, "print(last_run().status, sorted(last_run().exit_codes.items()))")
        _assert_ok(reply, outputs)
        assert "finished [(0, 0), (1, 0)]" in "".join(m["content"].get("text", "") for m in outputs)
        assert kernel.children(recursive=True) == []
