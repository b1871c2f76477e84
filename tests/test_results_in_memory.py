"""A large result comes back through an in-memory file the kernel maps (a memfd), not the pipe: bit for bit, its
tensors windows of that mapping, and nothing of it left once the result is dropped, after a failed run, after
a rank killed while writing it, after the kernel dies. A rank that cannot write it sends it through the pipe,
and the run says so once; a rank's word on the file's layout is checked against the file. Real launches."""

import gc
import os
import re
import signal
import sys
import textwrap
import time

import psutil
import pytest
import torch

from notebook_launcher import RankFailedError, ResultUnavailableError, last_run, notebook_launcher
from notebook_launcher.schema.result_memory import write_result

NAME = "notebook-launcher-result-"


@pytest.fixture(autouse=True)
def _no_earlier_result_kept():
    """The runs an earlier test of this process kept (their results, mapped) are let go first: each test here
    counts the result mappings of this process."""
    from notebook_launcher.runs import forget_all

    forget_all()
    gc.collect()


def held(pid: int, where: str) -> list[str]:
    """The result files process ``pid`` holds: its descriptors (``fd``) or its mappings (``maps``)."""
    try:
        if where == "maps":
            with open(f"/proc/{pid}/maps") as maps:
                return [line.split()[-2] for line in maps if NAME in line]
        links = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
        return [link for link in links if NAME in link]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def no_children_left():
    assert psutil.Process().children(recursive=True) == []


def rank_of(name: str) -> str:
    """The rank whose result a file is for, from its name (``...-<kernel pid>-<rank>-<piece>``)."""
    return name.split("-")[-2]


def kernel_files(kernel: int, rank: int) -> list[str]:
    """In a rank: the paths of the kernel's in-memory files for ``rank``'s result, in the order of their pieces."""
    found = {}
    for fd in os.listdir(f"/proc/{kernel}/fd"):
        try:
            name = os.readlink(f"/proc/{kernel}/fd/{fd}")
        except OSError:
            continue
        if f"{NAME}{kernel}-{rank}-" in name:
            found[int(name.split("-")[-1].split()[0])] = f"/proc/{kernel}/fd/{fd}"
    assert found, "no result file"
    return [found[piece] for piece in sorted(found)]


def wait_until_mapped(kernel: int) -> None:
    """In a rank: until the kernel has mapped rank 0's result (a minute at most)."""
    deadline = time.monotonic() + 60
    while not any(f"{NAME}{kernel}-0" in name for name in held(kernel, "maps")):
        assert time.monotonic() < deadline, "the kernel never mapped rank 0's result"
        time.sleep(0.01)


def state_dict_and_more():
    import torch.distributed as dist

    generator = torch.Generator().manual_seed(dist.get_rank())
    return {"weight": torch.randn(1000, 700, generator=generator), "bias": torch.arange(9, dtype=torch.float64)[1:],
            "param": torch.nn.Parameter(torch.ones(3)), "frozen": torch.zeros(2).requires_grad_(False),
            "step": 7}


@pytest.mark.processes
def test_a_large_result_comes_back_mapped_bit_for_bit_and_is_freed_with_its_tensors():
    me = os.getpid()
    results = notebook_launcher(state_dict_and_more, num_processes=2, device="cpu", results="all")
    back = {rank: last_run().result(rank) for rank in (0, 1)}
    assert results is back[0]
    for rank, value in back.items():
        generator = torch.Generator().manual_seed(rank)
        assert torch.equal(value["weight"], torch.randn(1000, 700, generator=generator))
        assert value["bias"].tolist() == list(range(1, 9)) and value["bias"].dtype == torch.float64
        assert type(value["param"]) is torch.nn.Parameter and value["param"].requires_grad
        assert not value["frozen"].requires_grad and value["step"] == 7
        assert all(value[key].untyped_storage().data_ptr() % 64 == 0 for key in ("weight", "bias", "param"))
    mapped = held(me, "maps")  # each rank's result is one mapping of its file, and no descriptor stays open
    assert sorted({rank_of(name) for name in mapped}) == ["0", "1"] and held(me, "fd") == []
    back[0]["weight"].add_(1)  # the kernel's own memory: writable
    del results, back, value
    last_run().results.clear()
    gc.collect()
    assert held(me, "maps") == [] and held(me, "fd") == []
    no_children_left()


def returns_after_the_other_fails():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        wait_until_mapped(os.getppid())
        raise ValueError("rank 1 gives up")
    return torch.ones(2**20)


@pytest.mark.processes
def test_a_failed_run_leaves_no_result_file_behind():
    me = os.getpid()
    with pytest.raises(RankFailedError):
        notebook_launcher(returns_after_the_other_fails, num_processes=2, device="cpu")
    assert held(me, "fd") == []  # rank 1's file, never written, is closed with the attempt
    kept = last_run().results  # rank 0's result came before the failure: the run keeps it, in its mapping
    assert list(kept) == [0] and bool((kept[0] == 1).all())
    assert {rank_of(name) for name in held(me, "maps")} == {"0"}
    kept.clear()
    gc.collect()
    assert held(me, "maps") == []
    no_children_left()


def killed_while_writing():
    import threading

    import torch.distributed as dist

    if dist.get_rank() == 0:
        path = kernel_files(os.getppid(), 0)[0]

        def kill_at_first_byte():  # the file is sized as the rank starts writing it: the rank dies in the middle
            while os.stat(path).st_size == 0:
                time.sleep(0.0005)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=kill_at_first_byte, daemon=True).start()
        return torch.ones(2**26)  # 256 MiB: written for far longer than the thread takes to see it
    return None


@pytest.mark.processes
def test_a_rank_killed_while_writing_its_result_leaves_nothing_behind():
    me = os.getpid()
    with pytest.raises(RankFailedError) as caught:
        notebook_launcher(killed_while_writing, num_processes=2, device="cpu")
    assert "SIGKILL" in str(caught.value)
    assert 0 not in last_run().results and held(me, "fd") == [] and held(me, "maps") == []
    no_children_left()


CELL = textwrap.dedent("""
    import time
    import torch
    from notebook_launcher import notebook_launcher

    def rank_0_returns_rank_1_waits():
        import torch.distributed as dist
        if dist.get_rank() == 1:
            time.sleep(120)
        return torch.ones(2**20)

    notebook_launcher(rank_0_returns_rank_1_waits, num_processes=2, device="cpu")
""")


@pytest.mark.kernel
def test_a_kernel_that_dies_holding_a_result_leaves_no_result_file_behind(tmp_path):
    from helpers.kernel import running_kernel

    env = {**os.environ, "NOTEBOOK_LAUNCHER_RUNS_DIR": str(tmp_path / "runs")}
    with running_kernel(tmp_path, env) as (_, client, kernel):
        client.execute(CELL)
        deadline = time.monotonic() + 90
        while not held(kernel.pid, "maps"):  # rank 0's result is mapped in the kernel; rank 1 still runs
            assert time.monotonic() < deadline, "the result never came"
            time.sleep(0.05)
        ranks = kernel.children(recursive=True)
        assert any(held(rank.pid, "fd") for rank in ranks)  # (forked ranks hold the kernel's files too)
        kernel.kill()
        kernel.wait(timeout=30)
        gone, alive = psutil.wait_procs(ranks, timeout=30)  # the ranks die with their parent
        assert alive == []
    mine = f"{NAME}{kernel.pid}-"
    holders = [process.pid for process in psutil.process_iter() if process.uids().real == os.getuid()
               and any(mine in name for name in held(process.pid, "fd") + held(process.pid, "maps"))]
    assert holders == []


def returns_under_a_file_size_limit():
    import resource

    import torch.distributed as dist

    if dist.get_rank() == 0:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails (EFBIG), as in a container
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        return [torch.full((2**20,), 3.0), torch.full((2**20,), 4.0)]
    return None


@pytest.mark.processes
def test_a_result_that_cannot_be_written_in_memory_comes_through_the_pipe_and_the_run_says_so_once(capfd):
    back = notebook_launcher(returns_under_a_file_size_limit, num_processes=2, device="cpu", display="text",
                             results="all")
    assert bool((back[0] == 3.0).all()) and bool((back[1] == 4.0).all())
    assert held(os.getpid(), "maps") == []
    said = capfd.readouterr().out
    assert said.count("result came through its pipe, not shared memory") == 1, said
    assert "rank 0's result came through its pipe, not shared memory (OSError: [Errno 27] File too large)" in said
    no_children_left()


def lies_about_its_file(lie: str):
    import torch.distributed as dist

    from notebook_launcher.schema.results import pack_result

    if dist.get_rank() == 0:  # (tensors too small to be moved onto the file: its rank may still shrink it)
        data, parts = pack_result([torch.ones(2**15) for _ in range(12)], 0, "all")
        paths = kernel_files(os.getppid(), 0)
        failed, data["phases"] = write_result(paths, parts)
        assert failed == "" and data["phases"] == [-1] * 12
        del data["attachment_bytes"]
        data["in_memory"] = True
        if lie == "longer":
            data["storages"][-1] += 4096
        elif lie == "shrunk":
            os.truncate(paths[0], 100)
        sys.stdout._channel.emit_parts("result", data, [])
    return 1


@pytest.mark.processes
@pytest.mark.parametrize("lie", ["longer", "shrunk"])
def test_a_result_file_that_is_not_what_its_event_says_is_refused(lie):
    with pytest.raises(ResultUnavailableError) as caught:
        notebook_launcher(lies_about_its_file, (lie,), num_processes=2, device="cpu")
    reason = caught.value.reason
    assert caught.value.rank == 0 and "the rank's result in memory is" in reason and "its sizes lay out" in reason
    assert held(os.getpid(), "fd") == [] and held(os.getpid(), "maps") == []
    no_children_left()


def shrinks_rank_0s_file_once_mapped():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        dist.barrier()
        return torch.ones(2**20)
    descriptor = os.open(kernel_files(os.getppid(), 0)[0], os.O_RDWR)  # (the kernel closes its own once it has mapped it)
    dist.barrier()
    wait_until_mapped(os.getppid())
    try:
        os.ftruncate(descriptor, 0)
    except PermissionError:
        print("shrinking refused")
    return None


@pytest.mark.processes
def test_a_rank_cannot_shrink_a_result_under_the_kernels_mapping(capfd):
    back = notebook_launcher(shrinks_rank_0s_file_once_mapped, num_processes=2, device="cpu", display="text")
    assert back.shape == (2**20,) and bool((back == 1).all())  # every page still there: no SIGBUS
    assert "shrinking refused" in capfd.readouterr().out
    no_children_left()


@pytest.mark.parametrize("data, attachment", [
    ({"type": "Tensor", "in_memory": True, "pickle_bytes": 10, "storages": [4]}, b"x" * 14),  # and on the pipe too
    ({"type": "Tensor", "in_memory": True, "pickle_bytes": 10}, b""),  # no sizes to check the file against
    ({"type": "Tensor", "in_memory": True, "pickle_bytes": 10, "storages": [0]}, b""),
])
def test_a_result_event_in_memory_with_a_bad_layout_is_refused_as_it_is_read(data, attachment):
    from notebook_launcher.schema.decoding import FrameDecoder
    from notebook_launcher.schema.events import encode_frame
    from notebook_launcher.schema.results import result_sinks

    decoder = FrameDecoder(result_sinks)
    assert decoder.feed(encode_frame(0, 1, "result", data, attachment)) == []  # the rank's stream ends there
    assert decoder.broken.startswith("a 'result' event in memory with an attachment, or without its")


def returns_storages_across_pieces():
    import torch.distributed as dist

    if dist.get_rank() != 0:
        return None
    sizes = (5_000_001, 9_999_991, 3, 12_345_679)  # int64 elements: ~210 MiB, odd sizes across the pieces' seams
    start, values = 0, []
    for count in sizes:
        values.append(torch.arange(start, start + count, dtype=torch.int64))
        start += count
    return values


@pytest.mark.processes
def test_a_result_cut_into_pieces_comes_back_whole_in_one_range_of_the_kernels_memory():
    from notebook_launcher.schema.result_memory import PIECE_FROM, files_for, layout, pieces

    me = os.getpid()
    back = notebook_launcher(returns_storages_across_pieces, num_processes=2, device="cpu")
    start = 0
    for value in back:  # every element where the rank put it, across the seams of the pieces
        assert torch.equal(value, torch.arange(start, start + value.numel(), dtype=torch.int64))
        start += value.numel()
    _, size = layout(0, [value.nbytes for value in back])
    expected = len(pieces(size, files_for(1)))
    assert expected == min(files_for(1), size // PIECE_FROM)  # (this machine's cores: more than one piece here)
    first, last = back[0].data_ptr(), back[-1].data_ptr() + back[-1].nbytes
    with open(f"/proc/{me}/maps") as maps:  # the mappings of this result's files (an earlier test's may be kept)
        ranges = [[int(end, 16) for end in line.split()[0].split("-")] for line in maps if NAME in line]
    ranges = [(start, end) for start, end in ranges if end > first and start < last]
    assert len(ranges) == expected and held(me, "fd") == []
    for (_, end), (following, _) in zip(ranges, ranges[1:]):  # side by side: one range, as the rank laid it out
        assert end == following
    del back, value
    last_run().results.clear()
    gc.collect()
    with open(f"/proc/{me}/maps") as maps:  # unmapped with the last of its tensors
        ranges = [[int(end, 16) for end in line.split()[0].split("-")] for line in maps if NAME in line]
    assert [(start, end) for start, end in ranges if end > first and start < last] == []
    no_children_left()


def test_pieces_cover_the_layout_in_whole_pages():
    import mmap

    from notebook_launcher.schema.result_memory import PIECE_FROM, pieces

    for size, files in [(1, 4), (PIECE_FROM - 1, 4), (2 * PIECE_FROM + 5, 2), (10**9 + 7, 4), (10**9, 1)]:
        cut = pieces(size, files)
        assert cut[0][0] == 0 and sum(length for _, length in cut) == size
        assert all(start + length == following for (start, length), (following, _) in zip(cut, cut[1:]))
        assert all(length % mmap.PAGESIZE == 0 for _, length in cut[:-1]) and len(cut) <= files
        assert len(cut) == 1 or min(length for _, length in cut[:-1]) >= PIECE_FROM


@pytest.mark.parametrize("lie", ["all in the first file", "pieces swapped"])
def test_files_whose_sizes_are_not_the_pieces_of_the_layout_are_refused(lie):
    from notebook_launcher.schema.result_memory import PIECE_FROM, MappedResult, pieces

    sizes = [3 * PIECE_FROM]
    cut = pieces(100 + 64 - 100 % 64 + sizes[0], 2)
    assert len(cut) == 2
    files = [os.memfd_create(f"{NAME}test-{piece}", os.MFD_ALLOW_SEALING) for piece in range(2)]
    lengths = [sum(length for _, length in cut), 0] if lie == "all in the first file" else \
        [cut[1][1], cut[0][1]]
    for descriptor, length in zip(files, lengths):
        os.ftruncate(descriptor, length)
    with pytest.raises(ValueError, match="its sizes lay out"):
        MappedResult(files).read(100, sizes)
    assert [name for name in held(os.getpid(), "fd") + held(os.getpid(), "maps") if "-test-" in name] == []


@pytest.mark.processes
def test_a_kernel_that_cannot_make_result_files_takes_results_through_the_pipe_with_failing_memfd_create(
        monkeypatch, capfd):
    def refused(*args):  # (what a kernel at its limit of open files gets)
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "memfd_create", refused)
    back = notebook_launcher(state_dict_and_more, num_processes=2, device="cpu", display="text", results="all")
    assert torch.equal(back["weight"], torch.randn(1000, 700, generator=torch.Generator().manual_seed(0)))
    said = capfd.readouterr().out
    assert said.count("result came through its pipe, not shared memory") == 1, said
    assert re.search(r"rank [01]'s result came through its pipe, not shared memory \(the kernel could not make it: "
                     r"OSError: \[Errno 24\] Too many open files\)", said), said  # (whichever rank's came first)
    no_children_left()


def returns_at_its_address_space_limit():
    import resource

    import torch.distributed as dist

    if dist.get_rank() != 0:
        return None
    value = torch.arange(25 * 2**20, dtype=torch.int32)  # 100 MiB: more than one piece
    used = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (used + 16 * 2**20, resource.RLIM_INFINITY))  # no room for a thread's stack
    return value


@pytest.mark.processes
def test_a_rank_at_its_memory_limit_still_writes_its_result_in_memory():
    me = os.getpid()
    back = notebook_launcher(returns_at_its_address_space_limit, num_processes=2, device="cpu")
    assert torch.equal(back, torch.arange(25 * 2**20, dtype=torch.int32))
    assert {rank_of(name) for name in held(me, "maps")} >= {"0"}  # in memory, written without its threads
    del back
    last_run().results.clear()
    gc.collect()
    no_children_left()


def claims_a_result_it_never_wrote():
    import torch.distributed as dist

    from notebook_launcher.schema.result_memory import layout, pieces
    from notebook_launcher.schema.results import pack_result

    if dist.get_rank() == 0:
        data, parts = pack_result(torch.ones(2**20), 0, "all")
        data["storages"] = [2**46]  # 64 TiB, in files made that long but never written (all holes)
        paths = kernel_files(os.getppid(), 0)
        _, size = layout(data["pickle_bytes"], data["storages"])
        for path, (_, length) in zip(paths, pieces(size, len(paths))):
            os.truncate(path, length)
        del data["attachment_bytes"]
        data["in_memory"] = True
        sys.stdout._channel.emit_parts("result", data, [])
    return 1


@pytest.mark.processes
def test_a_result_claimed_in_files_the_rank_never_wrote_is_refused_before_it_is_mapped():
    before = held(os.getpid(), "maps")  # (an earlier test's result may still be kept)
    with pytest.raises(ResultUnavailableError) as caught:
        notebook_launcher(claims_a_result_it_never_wrote, num_processes=2, device="cpu")
    assert "claims 70368744177" in caught.value.reason and "but its files hold only 0 of them" in caught.value.reason
    assert held(os.getpid(), "fd") == [] and held(os.getpid(), "maps") == before
    no_children_left()


def test_a_result_event_in_memory_for_a_rank_given_no_files_is_refused_clearly():
    from notebook_launcher.schema.results import unpack_result

    with pytest.raises(ValueError, match="the rank says its result is in memory, but it was given none"):
        unpack_result({"type": "Tensor", "in_memory": True, "pickle_bytes": 10, "storages": [4]}, b"")


def returns_and_reads_it_after():
    import atexit

    import torch.distributed as dist

    if dist.get_rank() != 0:
        return None
    value = {"weights": torch.arange(2**20 + 3, dtype=torch.float64), "small": torch.full((100,), 7.0),
             "shared": torch.ones(2**18).share_memory_()}
    as_numpy = value["weights"][5:].numpy()  # (a view of the same memory, by its address)
    its_file = os.open(kernel_files(os.getppid(), 0)[0], os.O_RDWR)  # (the kernel closes its own once mapped)

    def after_return():  # (an exit handler of the rank: runs once its result is written)
        moved = [line for line in open("/proc/self/maps") if NAME in line]
        intact = torch.equal(value["weights"], torch.arange(2**20 + 3, dtype=torch.float64)) and \
            as_numpy[12345] == 12350 and bool((value["small"] == 7).all())
        value["weights"].fill_(-1.0)
        value["shared"].fill_(-1.0)
        try:  # (its memory lives on that file now: cut short, the rank would die of SIGBUS reading it)
            os.ftruncate(its_file, 0)
            shrunk = "shrunk"
        except PermissionError:
            shrunk = "cannot shrink"
        print(f"after return: {len(moved)} moved, intact {intact}, now {value['weights'][0].item()}, {shrunk}, "
              f"reads {value['weights'][2**19].item()}", flush=True)  # (a moved page, written: its own copy)

    atexit.register(after_return)
    return value


@pytest.mark.processes
def test_a_rank_holds_its_written_result_once_and_what_it_does_after_never_reaches_the_kernel(capfd):
    back = notebook_launcher(returns_and_reads_it_after, num_processes=2, device="cpu", display="text")
    assert torch.equal(back["weights"], torch.arange(2**20 + 3, dtype=torch.float64))
    assert bool((back["small"] == 7).all()) and bool((back["shared"] == 1).all())
    # the 8 MiB storage now lives on the file's pages in the rank (one mapping), the small and the shared ones
    # where they were; the rank reads the same bytes there, and its writes stay its own
    assert "after return: 1 moved, intact True, now -1.0, cannot shrink, reads -1.0" in capfd.readouterr().out
    del back
    last_run().results.clear()
    gc.collect()
    no_children_left()


@pytest.mark.processes
def test_only_the_private_memory_of_a_storage_is_moved_onto_its_file(tmp_path):
    """In a process of its own, as a rank (a mapping of a result file stays with the process that moved it): a
    heap tensor is moved, one shared with other processes, one over a file, and a small one are not; the file
    keeps the writes made to its tensor after that, and the kernel's copy none of them."""
    import json
    import subprocess

    on_disk = tmp_path / "weights.bin"
    on_disk.write_bytes(bytes(4 * 2**18))
    script = textwrap.dedent(f"""
        import fcntl, json, os, sys
        import torch
        from notebook_launcher.schema.result_memory import ResultFiles, write_result
        from notebook_launcher.schema.results import pack_result, unpack_result

        files = ResultFiles()
        paths = files.paths_for(0, 1)
        value = {{"heap": torch.arange(2**18, dtype=torch.float32), "shared": torch.ones(2**18).share_memory_(),
                  "file": torch.from_file({str(on_disk)!r}, shared=True, size=2**18, dtype=torch.float32),
                  "small": torch.arange(100.0)}}
        data, parts = pack_result(value, 0, "all")
        failed, data["phases"] = write_result(paths, parts)
        ranges = {{name: (tensor.data_ptr(), tensor.data_ptr() + tensor.nbytes) for name, tensor in value.items()}}
        with open("/proc/self/maps") as maps:
            mapped = [[int(end, 16) for end in line.split()[0].split("-")] for line in maps if {NAME!r} in line]
        moved = sorted(name for name, (low, high) in ranges.items() if any(a < high and b > low for a, b in mapped))
        sealed = bool(fcntl.fcntl(os.open(paths[0], os.O_RDONLY), fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK)
        value["heap"][2**17] = -1.0  # (on a moved page: the first one, partly another allocation's, is not moved)
        value["file"][2**17] = -1.0
        del data["attachment_bytes"]
        data["in_memory"] = True
        back = unpack_result(data, files.take(0))
        seen = {{name: float(tensor[min(2**17, tensor.numel() - 1)]) for name, tensor in back.items()}}
        print(json.dumps({{"failed": failed, "moved": moved, "sealed": sealed, "seen": seen,
                          "heap_now": float(value["heap"][2**17])}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["failed"] == "" and said["moved"] == ["heap"] and said["sealed"]  # (cut short: a SIGBUS)
    assert said["seen"] == {"heap": 2.0**17, "shared": 1.0, "file": 0.0, "small": 99.0} and said["heap_now"] == -1.0
    on_file = torch.from_file(str(on_disk), size=2**18, dtype=torch.float32)
    assert float(on_file[2**17]) == -1.0  # (still the file's memory)


@pytest.mark.parametrize("phases", [[-2], ["a page"], [1, 2], "0", [0.5], [True]])
def test_a_result_event_in_memory_with_bad_phases_is_refused_as_it_is_read(phases):
    import mmap

    phases = [mmap.PAGESIZE] if phases == ["a page"] else phases
    from notebook_launcher.schema.decoding import FrameDecoder
    from notebook_launcher.schema.events import encode_frame
    from notebook_launcher.schema.results import result_sinks

    data = {"type": "Tensor", "in_memory": True, "pickle_bytes": 10, "storages": [2**20], "phases": phases}
    decoder = FrameDecoder(result_sinks)
    assert decoder.feed(encode_frame(0, 1, "result", data, b"")) == []
    assert "'phases'" in decoder.broken, decoder.broken


def test_a_range_a_refused_move_took_away_is_mapped_again_with_its_bytes_from_the_file():
    """A ``MAP_FIXED`` that fails can take the old pages away first (the kernel unmaps before it maps): the
    storage's range is then mapped again and read back from the file, which holds its bytes."""
    import ctypes
    import mmap

    from notebook_launcher.schema.page_move import _mend, libc

    page = mmap.PAGESIZE
    memory = mmap.mmap(-1, 4 * page)
    memory[:] = b"r" * (4 * page)
    address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    file = os.memfd_create(f"{NAME}test-mend")
    try:
        os.write(file, bytes(range(256)) * (4 * page // 256))
        _mend(address, 4 * page, file, 0)  # every page still there: left as it is
        assert memory[:] == b"r" * (4 * page)
        assert libc().munmap(address + page, 2 * page) == 0  # (the hole a refused move can leave)
        _mend(address + page, 2 * page, file, page)
        assert memory[page:3 * page] == (bytes(range(256)) * (4 * page // 256))[page:3 * page]
        assert memory[:page] == b"r" * page and memory[3 * page:] == b"r" * page
    finally:
        os.close(file)
