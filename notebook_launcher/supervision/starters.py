"""How one rank's process comes to exist: one starter per start method, behind one method.

``start(spec, fds_to_close) -> (pid, popen or None)``: the child writes into the pipes named in ``spec``; the
kernel keeps the read ends. Both put the child in a process group of its own (a teardown reaches what it starts;
the SIGINT Jupyter sends to the kernel's group does not hit it half-way through a collective), one that it does
not lead (``group_leader``), so that ``os.setsid()`` works in the rank as in a script. Neither starts a thread:
the kernel forks with no helper thread of ours alive.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gc
import os
import signal
import subprocess
import sys
import warnings
from typing import TYPE_CHECKING

from ..schema.rank_spec import RankSpec
from .demux import CHANNELS
from .handles import WorkerProcess
from .orphans import spare, unspare

if TYPE_CHECKING:  # (only a type: this layer does not import the plan's module)
    from ..plan import LaunchPlan

PIPE_SIZE = 1 << 20  # fewer stalls for chatty workers; the kernel's reads keep up
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_TRUE = "/bin/true" if os.access("/bin/true", os.X_OK) else sys.executable  # any program: it only leads a group


@contextlib.contextmanager
def group_leader():
    """The id of a new process group, for a rank to join. A process that leads its group cannot make a session
    of its own (``os.setsid()`` fails with EPERM), so the group is made by a throwaway process (spawned without
    copying the kernel: vfork and exec), the rank joins it, and the throwaway is reaped: the group lives on with
    the rank in it and its id is not reused while it does."""
    leader = os.posix_spawn(_TRUE, [_TRUE], {}, setpgroup=0)
    spare(leader)  # the launch's own child, not an orphan for a teardown to take
    try:
        yield leader
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leader, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(leader, 0)
        unspare(leader)


class ForkStarter:
    """A copy of the kernel (fast; the function and its arguments are inherited, not pickled)."""

    def __init__(self, function, args: tuple):
        self.function = function
        self.args = args

    def start(self, spec: RankSpec, fds_to_close: list[int]) -> tuple[int, None]:
        """``fds_to_close``: the kernel's fds the child must not keep (other ranks' read ends, pidfds)."""
        from ..rank.worker import run_forked

        # The kernel's garbage is not the child's to collect: its finalizers may wait for threads that do not
        # exist in the child (a c10d store server's destructor joins its thread, and would block forever).
        # Frozen before the fork, so no collection can run in the child first; unfrozen again in the kernel.
        with group_leader() as group:
            gc.freeze()
            with warnings.catch_warnings():  # Python 3.12+ warns about fork in a threaded process (the kernel is)
                warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks",
                                        category=DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # child: never returns
                run_forked(spec, self.function, self.args, fds_to_close, group)
            gc.unfreeze()
            try:
                os.setpgid(pid, group)  # also done by the child, to the same group: whoever runs first
            except OSError:
                pass
        return pid, None


class SpawnStarter:
    """A fresh interpreter that loads the function from the payload file (``spec.payload_path``)."""

    def start(self, spec: RankSpec, fds_to_close: list[int]) -> tuple[int, subprocess.Popen]:
        """``fds_to_close`` is not needed: only the fds in ``spec`` are passed, every other one is closed."""
        from ..rank import rich_output
        from ..rank.worker import SPEC_ENV_VAR

        inherited = (spec.events_fd,) + ((spec.store_listen_fd,) if spec.store_listen_fd >= 0 else ())
        inherited += tuple(fd for _, *fds in spec.ordinal_fds for fd in fds)  # an XLA host's other ranks' pipes
        spec_for_child = dataclasses.replace(spec, stdout_fd=1, stderr_fd=2)
        package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env[SPEC_ENV_VAR] = spec_for_child.to_json()
        env[rich_output.ENV_VAR] = rich_output.kernel_flag()  # displays of a launch from a kernel reach it
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
        with group_leader() as group:  # (before 3.11, a session of its own: there os.setsid() fails in a rank)
            kwargs = {"process_group": group} if sys.version_info >= (3, 11) else {"start_new_session": True}
            popen = subprocess.Popen(
                [sys.executable, "-c", "from notebook_launcher.rank.worker import main_spawned; main_spawned()"],
                stdin=subprocess.DEVNULL, stdout=spec.stdout_fd, stderr=spec.stderr_fd, pass_fds=inherited,
                env=env, close_fds=True, **kwargs,
            )
        return popen.pid, popen


def starter_for(plan: LaunchPlan) -> ForkStarter | SpawnStarter:
    """The plan's start method ("fork", else spawn)."""
    if plan.start_method == "fork":
        return ForkStarter(plan.function, plan.args)
    return SpawnStarter()


def make_pipe() -> tuple[int, int]:
    """(read, write): a pipe for one of a rank's channels, enlarged where the system allows."""
    read, write = os.pipe()
    try:
        fcntl.fcntl(write, _F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass
    return read, write


def start_each_rank(plan: LaunchPlan, starter, spec_for, store_listen_fd: int):
    """A process per rank of this machine, started in rank order: yields each ``(WorkerProcess, pipes)`` once
    started (``pipes``: channel -> (read, write)); the caller watches it (and may open its pidfd) before the
    next starts, which closes what the kernel holds of the earlier ones."""
    kernel_fds: list[int] = []  # fds a later forked child must close (earlier ranks' read ends and pidfds)
    for local_rank in range(plan.num_processes):
        worker = WorkerProcess(rank=plan.global_rank(local_rank), local_rank=local_rank)
        pipes = {name: make_pipe() for name in CHANNELS}
        spec = spec_for(worker, pipes)
        own_read_ends = [read for read, _ in pipes.values()]
        if store_listen_fd >= 0 and worker.rank != 0:
            own_read_ends.append(store_listen_fd)  # (closed in the child: only rank 0 serves)
        try:
            worker.pid, worker.popen = starter.start(spec, kernel_fds + own_read_ends)
        except BaseException:  # the workers already started are stopped by the caller's teardown
            _close_pipes([pipes])
            raise
        yield worker, pipes
        kernel_fds += own_read_ends + ([worker.pidfd] if worker.pidfd is not None else [])


def start_xla_host(plan: LaunchPlan, starter, spec_for, store_listen_fd: int = -1):
    """device "xla": one process, torch_xla's host, carries every rank (``xla_host``). It holds every rank's
    pipes, and each ordinal writes on its own rank's, in whichever process or thread torch_xla runs it; the
    other ranks' ``WorkerProcess`` name the host's as theirs (``host``)."""
    workers = [WorkerProcess(rank=plan.global_rank(local), local_rank=local) for local in range(plan.num_processes)]
    pipes = [{name: make_pipe() for name in CHANNELS} for _ in workers]
    host = workers[0]
    spec = spec_for(host, pipes[0])
    spec.ordinal_fds = [[worker.rank] + [own[name][1] for name in CHANNELS]
                        for worker, own in zip(workers[1:], pipes[1:])]
    try:
        host.pid, host.popen = starter.start(spec, [read for own in pipes for read, _ in own.values()])
    except BaseException:
        _close_pipes(pipes)
        raise
    for worker, own in zip(workers, pipes):
        if worker is not host:
            worker.pid, worker.host = host.pid, host
        yield worker, own


def _close_pipes(pipes: list[dict]) -> None:
    for own in pipes:
        for read, write in own.values():
            os.close(read)
            os.close(write)
