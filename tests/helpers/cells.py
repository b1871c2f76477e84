"""Notebook cells several tests run in a real kernel, written once."""

from __future__ import annotations


def hang_cell(warm_up: int, hang_warning: float, timeout: float) -> str:
    """A cell whose rank 1 skips an all_reduce after ``warm_up`` good ones: a real hang, noticed after
    ``hang_warning`` seconds and stopped by ``timeout``; it prints "timed out as expected"."""
    return f'''\
import torch
import torch.distributed as dist
from notebook_launcher import LaunchTimeoutError, notebook_launcher

def skips_an_all_reduce():
    for _ in range({warm_up}):
        dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins it
    dist.barrier()

try:
    notebook_launcher(skips_an_all_reduce, num_processes=2, device="cpu", hang_warning={hang_warning}, timeout={timeout})
except LaunchTimeoutError:
    print("timed out as expected")
'''
