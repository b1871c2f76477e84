"""The launcher's own errors, under one base: ``except NotebookLauncherError`` catches any of them (an argument
of the wrong type is a plain ``TypeError``, an unwritable run log folder an ``OSError``, as Python would say).

Each also subclasses the built-in a user would expect (a bad argument is a ``ValueError``, a timeout a
``TimeoutError``), so existing ``except`` clauses keep working. The messages are written where the error is
raised; the classes only carry what a caller may want to inspect (the ``Run``, the root-cause rank).
``DistributedOperationException``, which ranks raise, is one of them too (the base lives in ``schema/error_base.py``,
which the rank side may import).
"""

from __future__ import annotations

from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from .schema.error_base import NotebookLauncherError
from .schema.wiretext import wire_text


class LaunchArgumentError(NotebookLauncherError, ValueError):
    """A launch argument is wrong; raised in the kernel before any process starts."""


class RankFailedError(NotebookLauncherError, ChildFailedError, RuntimeError):
    """A rank failed. The message starts with the root-cause rank and its traceback, then the other ranks.

    Attributes: ``rank`` (the root-cause rank), ``failure`` (its RankFailure), ``failures`` (all, by rank),
    ``run`` (the Run, with every event, exit code and the run log directory). It is also torch elastic's
    ``ChildFailedError``, which Accelerate's launcher raises, so ``except ChildFailedError`` (and
    ``pytest.raises(ChildFailedError, match=...)`` on the user's error text) catch it; ``str(error)`` stays ours.
    """

    def __init__(self, message: str, failure, failures: dict, run=None):
        Exception.__init__(self, message)  # (not ChildFailedError's: it formats torch elastic's error files)
        self.name = "notebook_launcher"
        self.rank = failure.rank
        self.failure = failure
        self.failures = failures
        self.run = run

    def get_first_failure(self) -> tuple[int, Any]:
        """(rank, failure) of the root cause, as ``ChildFailedError.get_first_failure`` gives."""
        return self.rank, self.failure


class LaunchTimeoutError(NotebookLauncherError, TimeoutError):
    """The run went past ``timeout=`` (or hung); the message holds every live rank's Python stacks then."""

    def __init__(self, message: str, run=None):
        super().__init__(message)
        self.run = run


class HostFailedError(NotebookLauncherError, RuntimeError):
    """A host's agent could not run (SSH failed, the agent crashed, or its stream was not signed)."""

    def __init__(self, message: str, run=None):
        super().__init__(message)
        self.run = run


class ResultUnavailableError(NotebookLauncherError, RuntimeError):
    """Every rank finished, but a return value could not be rebuilt in the kernel (unpickling it failed, e.g. its
    class exists only in the worker; or it held a DTensor, one rank's shard, that could not be gathered: the reason
    names the fix). Attributes: ``rank``, ``type`` (the value's type name), ``reason``, ``run``
    (the Run; the other ranks' results are in ``run.results``)."""

    def __init__(self, rank: int, type_name: str, reason: str, run=None):
        reason = wire_text(reason)  # (the unpickling's own error: a lone surrogate would break Jupyter's reply)
        super().__init__(f"rank {rank} finished, but its return value (a {type_name}) could not be rebuilt in the "
                         f"kernel: {reason}. Return plain data (tensors, numbers, dicts, a state_dict), or types "
                         f"importable in the notebook.")
        self.rank, self.type, self.reason, self.run = rank, type_name, reason, run


class RunNotFoundError(NotebookLauncherError, LookupError):
    """``inspect_run`` (or ``Run.panel``) was given a run that is not in this process nor in the run log folder."""


class DetachedRunError(NotebookLauncherError, RuntimeError):
    """A detached run ended without a result: ``status`` "interrupted" (``stop()``) or "lost" (its supervisor was
    killed; its ranks died with it)."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status
