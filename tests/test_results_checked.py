"""A rank's result as the kernel rebuilds it: storages checked against what the pickle asks of them before any
tensor is made, a claimed size bounded before anything is allocated, an unpickling that raises KeyboardInterrupt
or SystemExit a ResultUnavailableError like any other; Parameters keep their type and requires_grad. Real
processes where it is about a launch."""

import os
import sys
import time

import psutil
import pytest
import torch

from notebook_launcher import RankFailedError, ResultUnavailableError, last_run, notebook_launcher
from notebook_launcher.schema.decoding import FrameDecoder
from notebook_launcher.schema.events import FRAME_HEADER, encode_frame
from notebook_launcher.schema.results import pack_result, result_sinks, unpack_result


def no_children_left():
    assert psutil.Process().children(recursive=True) == []


def short_storage_result():
    """A result whose pickle asks 1,000 float32 of a storage that holds 8 bytes (rank 0's result event)."""
    data, parts = pack_result(torch.zeros(1000), 0, "auto")
    data.update(storages=[8], attachment_bytes=parts[0].nbytes + 8, bytes=parts[0].nbytes + 8)
    return data, [parts[0], b"\x01" * 8]


def sends_a_short_storage():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        data, parts = short_storage_result()
        sys.stdout._channel.emit_parts("result", data, parts)
    return 1


@pytest.mark.processes
def test_a_storage_smaller_than_its_tensor_is_refused_in_a_launch():
    with pytest.raises(ResultUnavailableError) as caught:
        notebook_launcher(sends_a_short_storage, num_processes=2, device="cpu")
    assert caught.value.rank == 0 and "needs 4000 bytes of its storage, which holds 8" in caught.value.reason
    assert caught.value.run.status == "failed"
    no_children_left()


def test_a_storage_smaller_than_its_tensor_is_refused_before_a_tensor_is_made():
    data, parts = short_storage_result()
    attachment = b"".join(bytes(part) for part in parts)
    [(header, received)] = FrameDecoder(result_sinks).feed(encode_frame(0, 1, "result", data, attachment))
    with pytest.raises(Exception, match=r"a tensor of shape \(1000,\) \(4-byte elements, strides \(1,\), offset 0\) "
                                        r"needs 4000 bytes of its storage, which holds 8"):
        unpack_result(header["data"], received)
    with pytest.raises(Exception, match="needs 4000 bytes"):
        unpack_result(data, attachment)  # the same as one buffer (an agent's)
    whole, parts = pack_result({"t": torch.arange(10.0)[2:5], "empty": torch.zeros(0, 3)}, 0, "auto")
    back = unpack_result(whole, b"".join(bytes(part) for part in parts))  # views and empty tensors still come
    assert back["t"].tolist() == [2.0, 3.0, 4.0] and back["empty"].shape == (0, 3)


def _vm_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def test_a_claimed_size_costs_nothing_until_its_bytes_arrive():
    """A header of 1.5 GiB with nothing behind it: no storage is made (the kernel's address space does not grow)."""
    size = 3 * 2**29
    header = encode_frame(0, 1, "result", {"type": "Tensor", "bytes": size + 10, "attachment_bytes": size + 10,
                                           "pickle_bytes": 10, "storages": [size]})
    header = FRAME_HEADER.pack(*FRAME_HEADER.unpack_from(header)[:1], size + 10) + header[FRAME_HEADER.size:]
    before = _vm_kb("VmSize")
    decoder = FrameDecoder(result_sinks)
    assert decoder.feed(header + b"p" * 10) == [] and not decoder.broken
    assert (_vm_kb("VmSize") - before) * 1024 < size // 4
    assert decoder.frame_pending == size


def test_a_claimed_size_beyond_the_memory_available_is_refused_before_allocating():
    with open("/proc/meminfo") as meminfo:
        available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    size = 2 * available  # (more than a frame's 32-bit length can say on most machines: asked of the sinks)
    with pytest.raises(MemoryError, match=r"a result of .* GiB, with .* GiB available here"):
        result_sinks({"data": {"type": "Tensor", "pickle_bytes": 10, "storages": [size - 10]}}, size)


def announces_a_large_result_then_dies():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        print("before the header")
        size = 2**32 - 1  # the most a frame can announce
        frame = encode_frame(1, 1, "result", {"type": "Tensor", "bytes": size, "attachment_bytes": size,
                                              "pickle_bytes": 10, "storages": [size - 10]})
        frame = FRAME_HEADER.pack(*FRAME_HEADER.unpack_from(frame)[:1], size) + frame[FRAME_HEADER.size:]
        os.write(sys.stdout._channel.fd, frame + b"p" * 10)  # the pickle's bytes, none of its storage's
        time.sleep(1)
        os.kill(os.getpid(), 9)
    dist.barrier()


@pytest.mark.processes
def test_a_rank_that_announces_4_gib_and_dies_before_sending_them_costs_the_kernel_nothing():
    largest = [0]
    watching = [True]

    def watch():
        before = _vm_kb("VmSize")
        while watching[0]:
            largest[0] = max(largest[0], _vm_kb("VmSize") - before)
            time.sleep(0.002)

    import threading

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(RankFailedError, match=r"Rank 1 failed first: killed by SIGKILL"):
            notebook_launcher(announces_a_large_result_then_dies, num_processes=2, device="cpu", display="text")
    finally:
        watching[0] = False
        watcher.join()
    assert largest[0] * 1024 < 2**31, f"the kernel's address space grew {largest[0] >> 10} MB"
    assert "before the header" in last_run().output(rank=1)
    assert [event.data["message"] for event in last_run().events if event.kind == "failure" and event.rank == 1] == \
        ["4294967285 bytes of an unfinished event (the worker died while writing it)"]
    no_children_left()


# -- unpickling that raises what is not an Exception ----------------------------------------------------------------
def returns_an_object_whose_unpickling_raises(what: str):
    class Raises:  # pickled by value; rebuilt in the kernel by calling its __reduce__'s function
        def __reduce__(self):
            return (eval, (f"(_ for _ in ()).throw({what}())",))

    return Raises()


def returns_three():
    return 3


@pytest.mark.parametrize("what", ["KeyboardInterrupt", "SystemExit"])
@pytest.mark.processes
def test_an_unpickling_that_raises_keyboardinterrupt_or_systemexit_is_a_result_unavailable(what):
    with pytest.raises(ResultUnavailableError) as caught:
        notebook_launcher(returns_an_object_whose_unpickling_raises, args=(what,), num_processes=2, device="cpu")
    assert caught.value.rank == 0 and caught.value.type == "Raises" and what in caught.value.reason
    assert last_run().status == "failed"
    assert notebook_launcher(returns_three, num_processes=2, device="cpu") == 3  # and the kernel goes on
    no_children_left()


# -- Parameters -----------------------------------------------------------------------------------------------------
def returns_parameters():
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    return {"weight": model.weight, "bias": model.bias, "grad": torch.ones(2, requires_grad=True),
            "state": model.state_dict()}


@pytest.mark.processes
def test_parameters_come_back_as_parameters_with_their_requires_grad():
    got = notebook_launcher(returns_parameters, num_processes=2, device="cpu")
    assert type(got["weight"]) is torch.nn.Parameter and got["weight"].requires_grad
    assert type(got["bias"]) is torch.nn.Parameter and not got["bias"].requires_grad
    assert got["grad"].requires_grad and type(got["grad"]) is torch.Tensor
    assert not got["state"]["weight"].requires_grad  # a state_dict holds plain tensors, as in the rank
    assert got["weight"].shape == (2, 3)
