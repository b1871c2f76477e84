"""notebook_launcher: run a PyTorch training function on several processes from a Jupyter notebook.

    from notebook_launcher import notebook_launcher
    result = notebook_launcher(train, args=(1e-3,), num_processes=2)
"""

from ._version import __version__
from .detached import DetachedRun, attach
from .doctor import doctor, env_report, same_effective_batch
from .errors import (
    DetachedRunError,
    HostFailedError,
    LaunchArgumentError,
    LaunchTimeoutError,
    NotebookLauncherError,
    RankFailedError,
    ResultUnavailableError,
    RunNotFoundError,
)
from .launcher import notebook_launcher
from .ops import (
    DistributedOperationException,
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
)
from .rank.logging import get_logger
from .rank.memory import find_executable_batch_size, free_memory, release_memory, should_reduce_batch_size
from .rank.progress import report
from .rank.seeding import set_seed
from .rank.triggers import check_trigger, set_trigger
from .runs import Run, inspect_run, last_run, recent_runs
from .schema.runlog import read_run_log

__all__ = [
    # launching
    "notebook_launcher",
    # inside the launched function
    "broadcast",
    "broadcast_object_list",
    "check_trigger",
    "find_executable_batch_size",
    "free_memory",
    "gather",
    "gather_object",
    "get_logger",
    "pad_across_processes",
    "reduce",
    "release_memory",
    "report",
    "same_effective_batch",
    "set_seed",
    "set_trigger",
    "should_reduce_batch_size",
    # runs and diagnostics
    "DetachedRun",
    "Run",
    "attach",
    "doctor",
    "env_report",
    "inspect_run",
    "last_run",
    "read_run_log",
    "recent_runs",
    # errors
    "DetachedRunError",
    "DistributedOperationException",
    "HostFailedError",
    "LaunchArgumentError",
    "LaunchTimeoutError",
    "NotebookLauncherError",
    "RankFailedError",
    "ResultUnavailableError",
    "RunNotFoundError",
    "__version__",
]


def load_ipython_extension(ipython) -> None:
    """``%load_ext notebook_launcher``: registers the ``%%accelerate`` cell magic."""
    from .magic import load_ipython_extension as load

    load(ipython)
