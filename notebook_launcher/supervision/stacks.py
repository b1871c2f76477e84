"""The Python stacks a rank dumps (faulthandler, on the kernel's SIGUSR1), as a user should read them.

Kernel side. A forked rank's stack holds, below the user's function, the frames it inherited from the kernel
(the cell that called ``notebook_launcher``, IPython, the supervisor and starters) and, above it, this
package's wrappers of the collectives. ``user_stack`` cuts every frame of notebook_launcher's own and
everything below the user's function entry (``rank/reporting.call_and_report``), and says in one line how many
it cut; the run log keeps the dump whole. ``cell_names`` (``schema/cells.py``) writes a notebook cell's file
(``/tmp/ipykernel_<pid>/<hash>.py``) the way IPython names it, ``cell In[5], line 19``.
"""

from __future__ import annotations

import os
import re
import sysconfig

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# where a rank (rank/worker.py) or an XLA ordinal (rank/xla_host.py) calls the user's function
_ENTRY = (os.path.join(PACKAGE_DIR, "rank", "reporting.py"), "call_and_report")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<function>.*)$')
_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-fA-F]+")
_NOT_USER = tuple({os.path.join(sysconfig.get_paths()[name], "") for name in ("stdlib", "platstdlib")})
_LIBRARIES = (f"{os.sep}torch{os.sep}", f"{os.sep}accelerate{os.sep}", f"{os.sep}lightning{os.sep}")


def _threads(lines: list[str]) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """faulthandler's dump as (thread header, [(file, line, function), innermost first]) per thread."""
    threads: list[tuple[str, list]] = []
    for line in lines:
        if _THREAD.match(line.strip()):
            threads.append((line.strip(), []))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1][1].append((frame["file"], frame["line"], frame["function"]))
    return threads


def _is_own(filename: str) -> bool:
    return filename.startswith(PACKAGE_DIR)


def _users_frames(frames: list[tuple[str, str, str]]) -> tuple[list[tuple[str, str, str]], int]:
    """The frames above the user's function entry that are not notebook_launcher's, and how many were cut."""
    kept, cut = [], 0
    for index, frame in enumerate(frames):
        if (frame[0], frame[2]) == _ENTRY:
            return kept, cut + len(frames) - index
        if _is_own(frame[0]):
            cut += 1
        else:
            kept.append(frame)
    return kept, cut


def user_stack(lines: list[str]) -> str:
    """A rank's stack dump (lines of its stderr after the request) with only the user's frames, one line saying
    how many frames of notebook_launcher's own were cut; "" when the lines hold no dump."""
    shown, cut = [], 0
    for header, frames in _threads(lines):
        kept, cut_here = _users_frames(frames)
        cut += cut_here
        if kept or not cut_here:
            shown.append(header)
            shown += [f'  File "{file}", line {line} in {function}' for file, line, function in kept]
    if cut:
        shown.append(f"({cut} frames of notebook_launcher's own below these are not shown; the run log has them)")
    return "\n".join(shown)


def innermost_user_frame(lines: list[str]) -> str:
    """``file:line in function`` of the innermost frame of the user's own code in the thread that runs the
    user's function (not notebook_launcher, torch, Accelerate, Lightning or the standard library); "" if none."""
    for file, line, function in _main_frames(lines):
        if _is_users(file):
            return f"{file}:{line} in {function}"
    return ""


# torch's own collectives a rank can wait in without its progress record knowing (C++ collectives of DDP's
# reducer, FSDP's, torch.distributed's internals), found from the innermost frames of its stack
_DDP_FILE = os.path.join("torch", "nn", "parallel", "distributed.py")
_DISTRIBUTED_DIR = os.path.join("torch", "distributed") + os.sep
_FSDP_DIRS = (os.path.join("torch", "distributed", "fsdp") + os.sep,
              os.path.join("torch", "distributed", "_composable", "fsdp") + os.sep)
_DDP_BUFFERS = {"_sync_buffers", "_sync_module_buffers", "_default_broadcast_coalesced",
                "_distributed_broadcast_coalesced", "_check_and_sync_module_buffers"}


def _main_frames(lines: list[str]) -> list[tuple[str, str, str]]:
    """The frames (innermost first, ours cut) of the thread that runs the user's function (else the first)."""
    threads = _threads(lines)
    main = [frames for _, frames in threads if any((f[0], f[2]) == _ENTRY for f in frames)]
    chosen = main[0] if main else threads[0][1] if threads else []
    return _users_frames(chosen)[0]


def _is_users(file: str) -> bool:
    return not (file.startswith(_NOT_USER) or any(part in file for part in _LIBRARIES) or file.startswith("<frozen"))


def _is_distributed(file: str) -> bool:
    return _DISTRIBUTED_DIR in file or file.endswith(_DDP_FILE)


def torch_place(lines: list[str]) -> str:
    """Where a rank that is in no collective of its progress record waits inside torch's distributed code, from
    its stack dump: "DDP's forward (a collective of DDP's reducer)", "DDP's buffer broadcast", "FSDP's
    _pre_forward", "torch.distributed's new_group"; "" otherwise.

    Only the innermost frames count, and only while they are all torch's distributed code (a C++ collective is
    called from there): a rank computing (its innermost frame in torch's modules, autograd, the optimizer, a
    library or the user's own code), even inside DDP's or FSDP's forward, is never given such a label."""
    chain = []
    for frame in _main_frames(lines):
        if not _is_distributed(frame[0]):
            break
        chain.append(frame)
    ddp = [function for file, _, function in chain if file.endswith(_DDP_FILE)]
    if ddp:
        innermost = ddp[0]
        if innermost in _DDP_BUFFERS:
            return "DDP's buffer broadcast"
        if innermost == "__init__":  # (its checks and broadcast are in torch/distributed/utils.py, inside)
            return "DDP's construction (its parameter broadcast)"
        return "DDP's forward (a collective of DDP's reducer)"
    fsdp = [function for file, _, function in chain if any(part in file for part in _FSDP_DIRS)]
    if fsdp:
        return f"FSDP's {fsdp[-1]}"  # the outermost: what the user's code reached
    named = [function for file, _, function in chain if not file.endswith("c10d_logger.py")]  # (its wrapper)
    return f"torch.distributed's {named[-1]}" if named else ""


def short_place(in_torch: str) -> str:
    """"DDP's forward (a collective of DDP's reducer)" -> "DDP's forward": the name alone, for one line."""
    return in_torch.split(" (", 1)[0]

