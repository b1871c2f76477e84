"""The runs folder: where it is, a new run's folder in it, and pruning the old ones (``runlog`` writes the run's
files, and reads them back)."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import time

RUNS_DIR_ENV_VAR = "NOTEBOOK_LAUNCHER_RUNS_DIR"
RUN_ID = re.compile(r"\d{8}-\d{6}-\d+-[0-9a-f]{6}")
KEEP_RUNS = 50


def runs_root() -> str:
    """Where run logs live: $NOTEBOOK_LAUNCHER_RUNS_DIR, else the user's cache directory."""
    explicit = os.environ.get(RUNS_DIR_ENV_VAR)
    if explicit:
        return explicit
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "notebook_launcher", "runs")


_NEW_ID_TRIES = 5


def run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{os.urandom(3).hex()}"


def new_run_folder(root: str) -> tuple[str, str]:
    """A new, private run folder under ``root``: (run id, path). A run id whose folder exists already (another
    machine's kernel with the same pid, sharing this folder, in the same second) is drawn again."""
    for _ in range(_NEW_ID_TRIES):
        name = run_id()
        try:
            os.mkdir(os.path.join(root, name), mode=0o700)
        except FileExistsError:
            continue
        return name, os.path.join(root, name)
    raise FileExistsError(errno.EEXIST, f"cannot make a new run folder in {root}: {_NEW_ID_TRIES} fresh run ids "
                          f"in a row ({name}, the last) name folders that exist already, so something other than "
                          f"this launcher makes folders named like run ids there: remove them, or set "
                          f"{RUNS_DIR_ENV_VAR} to a folder of its own")


def unusable(root: str, exc: OSError) -> OSError:
    """The error of a runs folder that cannot be written at all, with the fix."""
    return OSError(exc.errno, f"cannot write the run log in {root} ({exc.strerror or exc}): set "
                   f"{RUNS_DIR_ENV_VAR} to a folder you can write to")


PRUNE_MIN_AGE_S = 600  # a run folder with a file changed more recently than this is never pruned: a live run's
# kernel touches events.jsonl at least every runlog.KEEPALIVE_S (60 s), so 10 minutes leaves room for a shared folder's
# cached times (NFS: up to 60 s) and for clocks of the machines sharing it that disagree by minutes
_NEWEST_OF = 64  # the files of a run folder whose times are read (a run writes a handful)


def prune(root: str, keep: int, current: str = "") -> None:
    """Keep the ``keep`` newest run folders, newest by the time their newest file last changed (not by the stamp
    in their name, which another kernel's time zone or a clock set back can put in the future; not by the
    folder's own time, which does not move while events.jsonl grows). Never removed: the current run, any folder
    with a file changed in the last ``PRUNE_MIN_AGE_S`` seconds (a run going on, on any machine sharing the
    folder), and a folder without its summary whose kernel (the pid in its name) is still alive on this machine."""
    now = time.time()
    candidates = []
    try:
        entries = os.listdir(root)
    except OSError:
        return
    for entry in entries:  # only our own run directories are ever removed, whatever else lives in that folder
        path = os.path.join(root, entry)
        if entry == current or not RUN_ID.fullmatch(entry):
            continue
        changed = _last_changed(path)
        if changed is None or now - changed < PRUNE_MIN_AGE_S or _maybe_in_progress(entry, path):
            continue
        candidates.append((changed, entry))
    candidates.sort()
    for _, old in candidates[:max(0, len(candidates) - keep)]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)


def _last_changed(path: str) -> float | None:
    """When the run folder ``path`` or one of its files last changed (links not followed); None when it is not a
    folder (a link to one included)."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
        changed = os.stat(path).st_mtime
        with os.scandir(path) as files:
            for number, item in enumerate(files):
                if number >= _NEWEST_OF:
                    break
                with contextlib.suppress(OSError):
                    changed = max(changed, item.stat(follow_symlinks=False).st_mtime)
    except OSError:
        return None
    return changed


def _maybe_in_progress(run_id: str, path: str) -> bool:
    if os.path.exists(os.path.join(path, "run.json")):
        return False
    pid = int(run_id.split("-")[2])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists (owned by someone else)
    return True
