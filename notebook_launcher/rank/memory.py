"""Out-of-memory retries: ``find_executable_batch_size`` halves the batch until it fits, on every rank alike.

    @find_executable_batch_size(starting_batch_size=128)
    def inner_training_loop(batch_size):
        model, optimizer, loader = build(batch_size)      # rebuilt at every try
        ...

    inner_training_loop()                                  # no batch size: the decorator passes it

In one process (the kernel, a script) an out-of-memory error frees memory and calls the function again with half
the batch. In a launched run with several ranks, one rank running out while the others wait in a collective
cannot be fixed in place: that rank reports it, the kernel stops every rank and starts them all again, and the
decorator on every rank starts from the new, smaller size. So all ranks always run the same batch size, nobody
hangs, and everything the inner function built is built anew. Each retry shows in the cell.
"""

from __future__ import annotations

import functools
import gc
import inspect
import json
import os
import resource
import sys
from collections.abc import Callable

from ..schema.events import BATCH_SIZE
from . import context

BATCH_SIZES_ENV_VAR = "NOTEBOOK_LAUNCHER_BATCH_SIZES"  # set by the kernel on a restart: {function key: size}
_OOM_TEXTS = (
    "CUDA out of memory.",  # CUDA
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",  # cuDNN, when it cannot get memory
    "DefaultCPUAllocator: can't allocate memory",  # the CPU allocator
    "XPU out of memory.",
    "MPS backend out of memory",
    "out of memory",  # HPU and others ("RuntimeError: ... out of memory")
)




class OutOfMemoryRetry(Exception):
    """Raised in a rank of a multi-rank run that ran out of memory: the kernel restarts every rank at
    ``new_batch_size``. ``event_data`` travels with the failure event."""

    def __init__(self, key: str, batch_size: int, new_batch_size: int, error: BaseException):
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        super().__init__(f"out of memory at batch size {batch_size} ({type(error).__name__}: {first_line}); "
                         f"all ranks restart at batch size {new_batch_size}")
        self.event_data = {"key": key, "batch_size": batch_size, "new_batch_size": new_batch_size,
                           "error": f"{type(error).__name__}: {first_line}", "memory": memory_figures()}


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True for the errors that mean "this did not fit in memory": torch.OutOfMemoryError (even with an empty
    message), CUDA/XPU/MPS/HPU out-of-memory texts, cuDNN's CUDNN_STATUS_NOT_SUPPORTED, the CPU allocator's
    "can't allocate memory", and Python's MemoryError."""
    if isinstance(exception, MemoryError):
        return True
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exception, getattr(torch, "OutOfMemoryError", ())):
        return True
    if isinstance(exception, RuntimeError) and len(exception.args) == 1:
        return any(text in str(exception.args[0]) for text in _OOM_TEXTS)
    return False


def free_memory(*objects) -> list[None]:
    """Collect garbage and empty the active device's cache; returns a list of None, one per object given (so
    ``model, optimizer = free_memory(model, optimizer)`` drops your references too)."""
    released = [None for _ in objects]
    del objects
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        xpu = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_available():
            xpu.empty_cache()
        mps = getattr(torch, "mps", None)
        if mps is not None and torch.backends.mps.is_available():
            mps.empty_cache()
    return released


def release_memory(*objects) -> list[None]:
    """Accelerate's name for ``free_memory(*objects)``: ``a, b = release_memory(a, b)``."""
    return free_memory(*objects)


def memory_figures() -> dict:
    """What the process holds now: resident memory, and the CUDA allocator's figures when CUDA is in use."""
    figures = {}
    try:
        with open("/proc/self/statm") as statm:
            pages = statm.read().split()
        figures["resident_bytes"] = int(pages[1]) * os.sysconf("SC_PAGE_SIZE")
        figures["virtual_bytes"] = int(pages[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        figures["cuda_allocated_bytes"] = torch.cuda.memory_allocated()
        figures["cuda_reserved_bytes"] = torch.cuda.memory_reserved()
        figures["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    return figures


def peak_memory_figures() -> dict:
    """``peak_rss``: the rank's peak resident set in bytes (``ru_maxrss``; after a fork it includes the pages the
    rank still shares with the kernel, alike on every rank); ``cuda``: the CUDA allocator's peaks on the rank's
    device and the device's memory, or None."""
    unit = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is in bytes on macOS, KiB on Linux
    peaks = {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit, "cuda": None}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        peaks["cuda"] = {"peak_allocated": int(torch.cuda.max_memory_allocated(device)),
                         "peak_reserved": int(torch.cuda.max_memory_reserved(device)),
                         "total": int(torch.cuda.get_device_properties(device).total_memory)}
    return peaks


def find_executable_batch_size(function: Callable | None = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Callable[[int], int] | None = None) -> Callable:
    """Decorator: call ``function(batch_size, ...)`` starting at ``starting_batch_size``; on an out-of-memory
    error free memory and try again with half (or ``reduce_batch_size_fn(batch_size)``), down to a clear error
    at zero ("No executable batch size found, reached zero.") listing the sizes tried. Other errors pass
    through untouched. Each call starts again from ``starting_batch_size``, except in ranks restarted by the
    launcher after an out-of-memory error, which start from the size every rank agreed on.

    Usable bare (``@find_executable_batch_size``) or with arguments
    (``@find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=lambda b: b - 8)``).
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    reduce_size = reduce_batch_size_fn or (lambda batch_size: batch_size // 2)
    key = f"{function.__module__}.{function.__qualname__}"
    parameters = list(inspect.signature(function).parameters)

    @functools.wraps(function)
    def decorator(*args, **kwargs):
        if len(args) + len(kwargs) >= len(parameters):
            shown = ", ".join([f"{name}={value!r}" for name, value in zip(parameters[1:], args[1:])] +
                              [f"{name}={value!r}" for name, value in kwargs.items()])
            raise TypeError(
                f"Batch size was passed into `{function.__name__}` as the first argument when called. Remove it: "
                f"the decorator passes it. Call `{function.__name__}({shown})`.")
        batch_size = _agreed_batch_size(key, starting_batch_size)
        tried = []
        while True:
            if batch_size <= 0:
                raise RuntimeError(f"No executable batch size found, reached zero. Tried: {tried}.")
            tried.append(batch_size)
            emit = context.current.emit  # in a launched worker: each try is a batch_size event
            if emit is not None:
                emit(BATCH_SIZE, {"key": key, "batch_size": batch_size})
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - only out-of-memory errors are handled below
                if not should_reduce_batch_size(error):
                    raise
                new_batch_size = reduce_size(batch_size)
                free_memory()
                if new_batch_size <= 0:
                    raise RuntimeError(f"No executable batch size found, reached zero. Tried: {tried}.") from error
                if context.current.distributed:  # peers: the kernel restarts the whole group
                    raise OutOfMemoryRetry(key, batch_size, new_batch_size, error) from error
                print(f"out of memory at batch size {batch_size} ({type(error).__name__}: "
                      f"{(str(error).strip().splitlines() or [''])[0][:200]}); trying {new_batch_size}",
                      file=sys.stderr)
                batch_size = new_batch_size

    return decorator


def _agreed_batch_size(key: str, starting_batch_size: int) -> int:
    try:
        agreed = json.loads(os.environ.get(BATCH_SIZES_ENV_VAR, "{}"))
    except ValueError:
        agreed = {}
    return int(agreed.get(key, starting_batch_size))
