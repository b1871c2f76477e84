"""How a rank's end reaches the kernel: its return value (tensors on the CPU) or its exception, as events.

Worker side: used by every rank (``worker``) and by each XLA ordinal (``xla_host``).
"""

from __future__ import annotations

import copy
import os
import sys
import traceback

from ..schema.error_base import NotebookLauncherError
from ..schema.events import FAILURE, RESULT, STATUS
from .memory import OutOfMemoryRetry

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def call_and_report(events, call, rank: int, results: str, explain=lambda exc: None, memory_paths: list = (),
                    reported=lambda: None) -> int:
    """Run ``call`` (the rank's setup and the user's function); its value or its exception goes to the kernel,
    then the rank's last status. Returns the rank's exit code. ``explain(exc)``: a message in place of the
    exception's own, or None; ``memory_paths``: where a large result is written (``report_result``);
    ``reported()``: called once the value is on its way, before this rank lets go of it (freeing a large one takes
    milliseconds, in which the other ranks may already be leaving)."""
    try:
        value = call()
        report_result(events, value, rank, results, memory_paths)
        reported()
        del value
        exit_code = 0
    except SystemExit as exc:
        exit_code = _exit_code_of(exc)
        if exit_code == 0:
            report_result(events, None, rank, results, memory_paths)
            reported()
        else:
            report_failure(events, exc, exit_code, message=f"the function called sys.exit({exc.code!r})")
    except BaseException as exc:  # noqa: BLE001 - every exception must reach the kernel
        exit_code = 1
        report_failure(events, exc, exit_code, message=explain(exc))
    events.emit(STATUS, {"state": "finished" if exit_code == 0 else "failed", "exit_code": exit_code})
    return exit_code


def _exit_code_of(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    return 1


def report_result(events, result, rank: int, results: str, memory_paths: list = ()) -> None:
    """The ``result`` event: the value's pickle and its tensors' bytes (``results.pack_result``), written into
    the kernel's in-memory files at ``memory_paths`` where there are some and the result is large (``in_memory``, no
    attachment), else through the pipe (with, where writing in memory failed, why: ``memory_failed``)."""
    from ..schema.result_memory import IN_MEMORY_FROM, write_result
    from ..schema.results import pack_result
    from .shards import whole

    data, parts = pack_result(to_cpu(whole(result, rank)), rank, results)
    if memory_paths and len(parts) > 1 and data["bytes"] >= IN_MEMORY_FROM:
        failed, phases = write_result(list(memory_paths), parts)
        if failed:
            data["memory_failed"] = failed
        else:
            del data["attachment_bytes"]
            data["in_memory"], parts = True, []
            if max(phases) >= 0:
                data["phases"] = phases
    events.emit_parts(RESULT, data, parts)


def report_failure(events, exc: BaseException, exit_code: int, message: str | None = None) -> None:
    """The ``failure`` event: the exception's type, message and traceback from the user's first frame on."""
    frames = exc.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frames = frames.tb_next  # from the user's first frame on: the launcher's add nothing to the story
    text = "".join(traceback.format_exception(type(exc), exc, frames))
    events.emit(FAILURE, {
        "type": type(exc).__qualname__,
        "module": type(exc).__module__,
        "message": message if message is not None else str(exc),
        "traceback": text,
        "exit_code": exit_code,
        # debug mode's check fails on every rank together: the kernel lets the others report it too
        "all_ranks_raise": isinstance(exc, NotebookLauncherError) and exc.raised_on_every_rank,
        "oom_retry": exc.event_data if isinstance(exc, OutOfMemoryRetry) else None,
    })


def to_cpu(value):
    """Tensors in the result come back on the CPU, so the kernel never touches a device, with their
    ``requires_grad`` (a Parameter as a Parameter). A device tensor's copy is referenced only by the value
    returned here: ``pack_result``'s byte views keep it alive."""
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    if isinstance(value, torch.nn.Parameter):  # a Parameter stays one, with its requires_grad
        return torch.nn.Parameter(value.detach().cpu(), requires_grad=value.requires_grad)
    if type(value) is torch.Tensor and value.device.type == "cpu" and not value.requires_grad:
        return value  # (no graph behind it, on the CPU: already what the kernel gets)
    if isinstance(value, torch.Tensor):  # (as a leaf: the graph behind it stays in the rank)
        return value.detach().cpu().requires_grad_(value.requires_grad)
    if isinstance(value, dict):
        clone = copy.copy(value)  # keeps a state_dict's _metadata
        for key, item in value.items():
            clone[key] = to_cpu(item)
        return clone
    if type(value) in (list, tuple):
        return type(value)(to_cpu(item) for item in value)
    return value
