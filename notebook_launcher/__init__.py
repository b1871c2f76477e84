"""notebook_launcher: run a PyTorch training function on several processes from a Jupyter notebook.

    from notebook_launcher import notebook_launcher
    result = notebook_launcher(train, args=(1e-3,), num_processes=2)
"""

from .doctor import doctor, env_report, same_effective_batch, set_seed
from .errors import (HostFailedError, LaunchArgumentError, LaunchTimeoutError, NotebookLauncherError, RankFailedError,
                     ResultUnavailableError, RunNotFoundError)
from .launcher import notebook_launcher
from .runs import Run, inspect_run, last_run
from .logging import get_logger
from .memory import find_executable_batch_size, free_memory, release_memory, should_reduce_batch_size
from .ops import DistributedOperationException
from .progress import report
from .triggers import check_trigger, set_trigger

__version__ = "0.1.0"

__all__ = [
    "DistributedOperationException",
    "HostFailedError",
    "LaunchArgumentError",
    "LaunchTimeoutError",
    "NotebookLauncherError",
    "RankFailedError",
    "ResultUnavailableError",
    "RunNotFoundError",
    "check_trigger",
    "doctor",
    "env_report",
    "find_executable_batch_size",
    "free_memory",
    "inspect_run",
    "Run",
    "get_logger",
    "last_run",
    "notebook_launcher",
    "release_memory",
    "report",
    "same_effective_batch",
    "set_seed",
    "set_trigger",
    "should_reduce_batch_size",
]


def load_ipython_extension(ipython) -> None:
    """``%load_ext notebook_launcher``: registers the ``%%accelerate`` cell magic."""
    from .magic import load_ipython_extension as load

    load(ipython)
