"""``notebook_launcher()``, the public entry point: check every argument, make the plan, launch it.

The launch itself (record, display, mechanism, attempts) is ``launchers.launch``; this module only turns the
Accelerate-compatible keywords into a checked plan, so a bad argument is refused before anything starts.
"""

from __future__ import annotations

from textwrap import indent
from typing import Any

from .cluster.remote import resolve_hosts, without_user
from .display import is_display
from .display.panel import DISPLAYS
from .errors import LaunchArgumentError
from .keywords import bind, docstring_list, signature
from .launchers import HostSettings, launch
from .launchers.detach import lifetime, start
from .notebook_objects import is_cell_program, unchanged_note
from .plan import make_plan


def notebook_launcher(*positional: Any, **keywords: Any) -> Any:
    """Run ``function(*args)`` on ``num_processes`` ranks from a notebook and return rank 0's return value.

    Accelerate-compatible: every keyword up to ``log_line_prefix_template`` means what it means in
    ``accelerate.notebook_launcher`` (and may be given by position, as there); ours are keyword-only.

    Keywords:

{KEYWORDS}

    Each worker gets MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    ACCELERATE_MIXED_PRECISION (and ACCELERATE_USE_CPU on CPU), and an initialized default process group, so
    plain DDP code and ``accelerate.Accelerator()`` both work inside ``function``. If ``use_port`` is taken, a
    free port is used (single-node runs). Workers' stdout/stderr (Python and C++) show in this cell, each line
    prefixed with its rank (``log_line_prefix_template``, default ``"[rank ${rank}] "``) or in the panel's
    rank columns, and go to a run log on disk.

    If any rank raises, exits or is killed, every other rank is stopped (with its child processes) and a
    ``RankFailedError`` names the rank that failed first, with its traceback, then what the others were doing.
    A kernel interrupt stops every worker and raises KeyboardInterrupt. ``num_processes=1`` runs the function
    in this kernel. ``max_restarts`` relaunches all ranks after a failure up to that many times.

    Example::

        def train(lr):
            import torch.distributed as dist
            t = torch.ones(1) * lr
            dist.all_reduce(t)
            return t.item()

        notebook_launcher(train, args=(0.5,), num_processes=2)   # → 1.0

    Several hosts from one notebook: ``hosts=["node-a", "node-b"]`` (or ``hostfile=``, one host per line) starts
    ``num_processes`` ranks on each host over SSH (``ssh_options``, e.g. ``["-p", "2222", "-i", key]``; the
    same Python path must exist on every host with notebook_launcher installed), ships the function with
    cloudpickle, and brings every rank's events back into this cell, signed with a secret made for the run. A
    failure or an interrupt on any host stops every host. ``start_hosts_with="mpirun"`` starts the hosts' agents
    with the MPI found instead (``mpirun_options`` are added to its command); they connect back to this kernel.
    ``start_hosts_with="srun"`` (Slurm) starts one agent per node of the job this kernel runs in with srun
    (``hosts=`` may narrow the nodes); from outside a job, ``slurm_options=["--nodes=2", ...]`` (salloc's options)
    asks Slurm for the allocation first, shows its job id and squeue's reason while it waits, and gives it back
    at the end (an interrupt or ``timeout=`` cancels it).

    ``detach=True`` returns a ``DetachedRun`` once the ranks have started: a supervisor process of its own runs
    them (the same supervision), so the run outlives this kernel; ``attach(run_id)`` in any kernel of the same
    user gives it back (``.status``, ``.progress``, ``.result()``, ``.stop()``; displayed, the live panel).

    ``last_run()`` gives the Run afterwards: results and exit codes by rank, events, the run log directory.

    Each rank trains its own copy of a model or tensor of the notebook's: the notebook's object is unchanged
    unless the function returns the weights (``return model.state_dict()``; then
    ``model.load_state_dict(notebook_launcher(...))``). When the function uses one and returns no module or
    tensor, a line after the run says so.
    """
    __tracebackhide__ = True  # IPython: the error is the story, not the launcher's frames
    function, args, given = bind(SIGNATURE, positional, keywords)
    display = given.display
    if isinstance(display, type):
        raise LaunchArgumentError(
            f"display={display.__name__} is a class: pass an instance, display={display.__name__}(...), or one of "
            f"{', '.join(map(repr, DISPLAYS))}")
    if not (display in DISPLAYS if isinstance(display, str) else is_display(display)):
        raise LaunchArgumentError(
            f"display={display!r} is not one of {', '.join(map(repr, DISPLAYS))}: use \"auto\" (the live panel in "
            f"Jupyter, text elsewhere), \"panel\" or \"text\"")
    if given.detach not in (True, False):
        raise LaunchArgumentError(f"detach={given.detach!r}: pass True (a detached run) or False")
    if given.detach and (given.hosts or given.hostfile):
        raise LaunchArgumentError("detach=True runs the ranks of this machine only: hosts=/hostfile= (ssh, mpirun, "
                                  "srun) cannot be detached yet; leave out detach=True to run across hosts")
    detach_for = lifetime(given.detach_for, given.detach)
    hosts = resolve_hosts(given.hosts, given.hostfile, given.num_nodes, given.node_rank, given.ssh_options,
                          given.start_hosts_with, given.mpirun_options, given.slurm_options)
    planned = given.for_plan()
    if hosts:
        planned.update(num_nodes=len(hosts), master_addr=without_user(hosts[0]))
    plan = make_plan(function, args, in_workers=bool(hosts), detached=given.detach is True, **planned)
    settings = HostSettings(hosts=hosts, ssh_options=given.ssh_options, start_with=given.start_hosts_with,
                            mpirun_options=given.mpirun_options, slurm_options=given.slurm_options) if hosts else None
    if given.detach:
        return start(plan, settings, display, detach_for=detach_for)
    result = launch(plan, display, settings)
    note = None if plan.runs_in_kernel or is_cell_program(function) else unchanged_note(function, args, result)
    if note:  # the ranks trained copies of a model of the notebook's, and none came back
        print(note)
    return result


SIGNATURE = signature()
notebook_launcher.__signature__ = SIGNATURE
notebook_launcher.__doc__ = notebook_launcher.__doc__.replace("{KEYWORDS}", indent(docstring_list(), "    "))
