"""Results whose tensors are copies made for the trip home (``.cpu()`` of a GPU or TPU tensor is a new tensor):
the bytes written to the kernel are the copy's, kept alive until written, never memory freed and reused.

On this machine a CPU tensor's ``.cpu()`` is the tensor itself, so ``CopiedByCpu`` (a real tensor subclass whose
``.cpu()`` returns a fresh copy, as CUDA's and XLA's do) makes the worker take the path a device result takes.
The same path with real XLA tensors runs in ``make test-xla``; with CUDA state_dicts in ``tests/gpu/``.
"""

import pytest
import torch

from notebook_launcher import last_run, notebook_launcher
from notebook_launcher.schema.decoding import FrameDecoder
from notebook_launcher.schema.events import encode_frame
from notebook_launcher.schema.results import pack_result, result_sinks, unpack_result

ELEMENTS = 200_000


class CopiedByCpu(torch.Tensor):
    """A CPU tensor whose ``.cpu()`` is a fresh tensor (its own storage), like a CUDA or XLA tensor's."""

    def cpu(self, *args, **kwargs):
        return torch.Tensor.cpu(self, *args, **kwargs).as_subclass(torch.Tensor).clone()


def expected(rank: int, name: str) -> torch.Tensor:
    seed = {"w": 1, "b": 2}[name] + 10 * rank
    return torch.arange(ELEMENTS, dtype=torch.float32) * 0.5 + seed


def returns_copied_state_dict():
    import torch.distributed as dist

    rank = dist.get_rank()
    state = {name: expected(rank, name).as_subclass(CopiedByCpu) for name in ("w", "b")}
    state["step"] = 7
    return state


def churn() -> list:
    """Allocations of the same sizes, filled with something else: freed memory gets reused by them."""
    return [torch.full((ELEMENTS,), -3.0) for _ in range(16)]


def test_a_packed_result_owns_the_bytes_of_a_temporary_tensor():
    data, parts = pack_result({"w": torch.arange(100_000.) + 1}, 0, "all")  # the dict and its tensor are gone
    filler = churn()
    attachment = b"".join(bytes(part) for part in parts)
    [(header, received)] = FrameDecoder(result_sinks).feed(encode_frame(0, 1, "result", data, attachment))
    back = unpack_result(header["data"], received)
    assert torch.equal(back["w"], torch.arange(100_000.) + 1)
    assert len(filler) == 16


@pytest.mark.processes
def test_results_copied_off_the_device_arrive_bit_exact_from_every_rank():
    for start_method in ("fork", "spawn"):
        state = notebook_launcher(returns_copied_state_dict, num_processes=2, device="cpu", results="all",
                                  start_method=start_method, display="text")
        results = last_run().results
        assert set(results) == {0, 1}
        for rank in (0, 1):
            for name in ("w", "b"):
                got = results[rank][name]
                assert type(got) is torch.Tensor and got.dtype == torch.float32
                assert torch.equal(got, expected(rank, name)), (start_method, rank, name, got[:4])
            assert results[rank]["step"] == 7
        assert state is results[0]
