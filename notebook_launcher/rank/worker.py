"""What runs in each rank: environment, process group, stream capture, result and exception reporting.

This module only knows the event schema (``events``); it never imports the kernel side. A worker:

1. dies with its parent (``PR_SET_PDEATHSIG``), so a crashed kernel leaves no orphan training on, and is the
   subreaper of what it starts, which it ends before exiting (nothing a rank started outlives it; if the rank is
   killed or aborts, the kernel, a subreaper too, ends it; what it forks dies with it: ``frameworks.at_fork``);
   it is in a process group of its own that it does not lead, so ``os.setsid()`` works in the user's code;
2. points fd 1 and fd 2 at pipes of its own and replaces ``sys.stdout``/``sys.stderr`` with unbuffered writers on
   them, so Python prints and C/C++ output (gloo, NCCL, torch warnings) reach the kernel in order and nothing is
   held in a buffer when the process is killed;
3. arms ``faulthandler`` (crash dumps, and all threads' stacks on SIGUSR1 for hang diagnosis);
4. sets the torch.distributed and ``ACCELERATE_*`` environment, initializes the default process group, runs the
   user's function, reports the result or the exception as events, and exits with ``os._exit`` so that nothing
   inherited from the kernel (atexit handlers, ipykernel threads' state) runs in the child.
"""

from __future__ import annotations

import atexit
import builtins
import faulthandler
import logging
import os
import pickle
import signal
import sys
from dataclasses import replace

from ..schema.events import STATUS, EventWriter
from ..schema.proctree import become_subreaper, die_with_parent, end_own_descendants
from ..schema.progress_record import ProgressRecord
from ..schema.rank_spec import RankSpec
from ..schema.results import inherit_kernel_main
from . import balance_meter, context, leaving
from .accelerate_state import prepare_accelerate
from .context import RankContext
from .frameworks import at_fork, not_interactive, refuse_nested_launchers, when_imported
from .logging import install_event_logging
from .reporting import call_and_report
from .rich_output import install as install_rich_output
from .streams import FdTextStream, one_write_print

SPEC_ENV_VAR = "NOTEBOOK_LAUNCHER_WORKER"


def run_forked(spec: RankSpec, function, args, inherited_fds_to_close, process_group: int = 0) -> None:
    """Entry point in a forked child. Never returns. ``process_group``: the group made for this rank, which it
    joins without leading it (a group leader's ``os.setsid()`` fails with EPERM; the user's code may call it)."""
    exit_code = 70  # EX_SOFTWARE, if even the setup below fails
    try:
        _own_process_group(process_group)
        reset_multiprocessing_after_fork()
        inherit_kernel_main()  # the notebook's classes in a result come back as the notebook's
        for fd in inherited_fds_to_close:
            try:
                os.close(fd)
            except OSError:
                pass
        exit_code = _run(spec, lambda: (function, args))
    finally:
        os._exit(exit_code)


def _own_process_group(group: int) -> None:
    """A process group of its own, so a teardown reaches DataLoader workers and Jupyter's SIGINT to the kernel's
    group stays with the kernel: ``group`` (also set by the kernel, whichever runs first), else one it leads."""
    try:
        os.setpgid(0, group)
    except OSError:  # the group is gone already (the kernel's setpgid failed): one of its own, as before
        os.setpgid(0, 0)


def reset_multiprocessing_after_fork() -> None:
    """What multiprocessing does in a child it forks itself: the kernel's finalizers are not the rank's, and
    objects registered for it (a ``multiprocessing.Queue`` made in the notebook) are reset, so that a rank's
    ``put()`` is not lost to a feeder thread that exists only in the kernel."""
    multiprocessing_util = sys.modules.get("multiprocessing.util")
    if multiprocessing_util is not None:
        multiprocessing_util._finalizer_registry.clear()
        multiprocessing_util._run_after_forkers()


def main_spawned() -> None:
    """Entry point of a spawned child (``python -c 'from notebook_launcher.rank.worker import main_spawned; ...'``)."""
    spec = RankSpec.from_json(os.environ.pop(SPEC_ENV_VAR))
    exit_code = 70
    try:
        exit_code = _run(spec, lambda: _load_payload(spec.payload_path))
    finally:
        os._exit(exit_code)


def _load_payload(path: str):
    """The spawn payload: the kernel's sys.path first (so by-reference pickles import), then (function, args)."""
    with open(path, "rb") as payload:
        kernel_sys_path = pickle.load(payload)
        for entry in kernel_sys_path:
            if entry not in sys.path:
                sys.path.append(entry)
        return pickle.load(payload)


def _run(spec: RankSpec, load_function) -> int:
    die_with_parent(spec.parent_pid)
    become_subreaper()  # what the user's code starts, even by a double fork, stays below this rank
    default_signal_handlers()
    atexit._clear()  # the kernel's exit handlers are not the worker's; the user's own run at the end
    if spec.device == "xla":  # this process is torch_xla's host of every rank: each ordinal writes its own
        from .xla_host import OrdinalWriters, run_host

        events = OrdinalWriters(spec)
    else:
        events = EventWriter(spec.events_fd, spec.rank)
    context.enter(RankContext(writer=events))  # what every hook of this rank sends goes through it
    kernel_streams = _capture_streams(spec, events)
    install_event_logging(kernel_streams)
    install_rich_output()  # display(), figures, widgets: as events, not on the kernel's sockets
    retarget_logging_handlers(kernel_streams)
    if spec.device == "xla":
        exit_code = run_host(spec, events, load_function)
    else:
        exit_code = _run_rank(spec, events, load_function)
    _run_exit_handlers()
    end_own_descendants()  # nothing the rank started outlives it
    return exit_code


def _run_rank(spec: RankSpec, events: EventWriter, load_function) -> int:
    """One rank in this process: the process group, the hooks, the function, its result or exception."""
    events.emit(STATUS, {"state": "starting", "pid": os.getpid(), "local_rank": spec.local_rank})
    at_fork()  # what the rank forks dies with it, and never tells its story as the rank
    os.environ.update(spec.env)

    def set_up_and_call():
        function, args = load_function()
        # a worker of a launch made already, not a notebook to launch from (Lightning's check); after the
        # payload's imports and the rank's IPython shell (rich_output), which sets sys.ps1 again
        not_interactive()
        prepare_accelerate(cpu_launch=spec.device == "cpu")
        _limit_cpu_threads(spec)
        grouped = _init_process_group(spec)
        progress = ProgressRecord(spec.progress_path) if grouped and spec.progress_path else None
        context.enter(replace(context.current, progress=progress, debug=spec.debug,
                              distributed=spec.world_size > 1))
        if grouped:
            _install_collective_hooks()
        _limit_memory(spec)
        balance_meter.start()
        events.emit(STATUS, {"state": "running"})
        try:
            return function(*args)
        finally:
            balance_meter.finish()

    exit_code = call_and_report(events, set_up_and_call, spec.rank, spec.results,
                                explain=lambda exc: _memory_limit_note(spec, exc), memory_paths=spec.result_paths,
                                reported=lambda: leaving.returned(spec.world_size))
    if exit_code == 0:
        leaving.leave(spec.world_size)
    return exit_code


def _memory_limit_note(spec: RankSpec, exc: BaseException) -> str | None:
    """An out-of-memory error in a worker with ``memory_limit`` says that the limit is what was reached."""
    from .memory import should_reduce_batch_size

    if not spec.memory_limit or not should_reduce_batch_size(exc):
        return None
    return (f"{exc} [this worker reached its memory_limit of {spec.memory_limit / 2**30:.2f} GiB: raise "
            f"memory_limit, or use a smaller batch (find_executable_batch_size does that for you)]")


def _no_input(prompt=""):
    raise EOFError("input() is not available in a launched worker: read values in the notebook and pass them "
                   "through args=(...)")


def default_signal_handlers() -> None:
    """A forked worker inherits the kernel's Python signal handlers (torch elastic and Accelerate leave theirs
    installed): the launcher's SIGTERM must end the worker at once, not become an exception in user code."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _capture_streams(spec: RankSpec, events: EventWriter) -> tuple:
    """Point fd 1/2 and sys.stdout/sys.stderr at the rank's pipes; returns the kernel's stream objects."""
    previous = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a worker asking for input() must not block on the kernel's stdin
    os.close(devnull)
    for source, target in ((spec.stdout_fd, 1), (spec.stderr_fd, 2)):
        if source != target:  # under spawn the pipes already are fd 1 and 2
            os.dup2(source, target)
            os.close(source)
    sys.stdout = sys.__stdout__ = FdTextStream(1, "<stdout>", events)
    sys.stderr = sys.__stderr__ = FdTextStream(2, "<stderr>", events)
    sys.stdin = sys.__stdin__ = open(os.devnull)  # noqa: SIM115 - lives as long as the worker
    builtins.input = _no_input  # ipykernel's input() would ask the notebook over its sockets and never return
    builtins.print = one_write_print(builtins.print)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    return previous


def retarget_logging_handlers(previous_streams) -> None:
    """Handlers the kernel set up on its own stdout/stderr would write through ipykernel's sockets from the
    child (slow, and lost after the cell ends): point them at the worker's streams."""
    previous_ids = {id(stream): index for index, stream in enumerate(previous_streams)}
    loggers = [logging.getLogger()] + [
        logger for logger in logging.Logger.manager.loggerDict.values() if isinstance(logger, logging.Logger)
    ]
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and id(stream) in previous_ids:
                # assigned, not setStream(): that would flush the kernel's stream object from the child
                handler.stream = sys.stdout if previous_ids[id(stream)] in (0, 2) else sys.stderr


def _install_collective_hooks() -> None:
    """Every torch.distributed collective records where this rank is (for hang diagnosis) and, in debug mode,
    checks that all ranks agree before it runs; so do DDP's own collectives (recorded, not checked; see
    ddp_watch, NOTEBOOK_LAUNCHER_DDP_WATCH=0: not). What they record and send is ``context.current``'s."""
    from . import collectives, ddp_watch, functional

    collectives.install()
    # DTensor's, FSDP2's and compiled code's collectives: once something imports torch's functional collectives
    when_imported(functional.FUNCTIONAL_MODULE, lambda module: functional.install())
    ddp_watch.install()
    refuse_nested_launchers()


def _limit_memory(spec: RankSpec) -> None:
    """``memory_limit`` caps the worker's address space, so an allocation over it fails as a real CPU OOM
    (find_executable_batch_size reports each try; with peers, an out-of-memory error restarts the group)."""
    if spec.memory_limit:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = spec.memory_limit if hard == resource.RLIM_INFINITY else min(spec.memory_limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _limit_cpu_threads(spec: RankSpec) -> None:
    if spec.cpu_threads > 0:
        import torch

        torch.set_num_threads(spec.cpu_threads)


def _init_process_group(spec: RankSpec) -> bool:
    """The default process group for the chosen backend (env:// from the variables the kernel set)."""
    if spec.device == "xla":
        return False
    import torch
    import torch.distributed as dist

    kwargs = {}
    if spec.device == "cuda":
        torch.cuda.set_device(spec.local_rank)
        kwargs["device_id"] = torch.device("cuda", spec.local_rank)
    if spec.explicit_store:
        store = dist.TCPStore(
            spec.env["MASTER_ADDR"], int(spec.env["MASTER_PORT"]), spec.world_size, is_master=spec.rank == 0,
            master_listen_fd=spec.store_listen_fd if spec.rank == 0 else None, wait_for_workers=False)
        # the prefix env:// adds itself: ranks of other nodes (which join through env://) see the same keys
        kwargs["store"] = dist.PrefixStore("default_pg", store)
    else:
        kwargs["init_method"] = "env://"
    dist.init_process_group(backend=spec.backend, rank=spec.rank, world_size=spec.world_size, **kwargs)
    return True


def _run_exit_handlers() -> None:
    """What a normal interpreter exit would do for the user's code (wandb, TensorBoard writers, file
    handlers), since the worker leaves with os._exit to skip everything inherited from the kernel."""
    try:
        multiprocessing_util = sys.modules.get("multiprocessing.util")
        if multiprocessing_util is not None:  # flushes the rank's Queues, as a multiprocessing child does
            multiprocessing_util._run_finalizers()
        atexit._run_exitfuncs()
    except Exception:  # noqa: BLE001
        pass
    logging.shutdown()
