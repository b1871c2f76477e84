"""``notebook_launcher()``, the public entry point: check every argument, make the plan, launch it.

The launch itself (record, display, mechanism, attempts) is ``launchers.launch``; this module only turns the
Accelerate-compatible keywords into a checked plan, so a bad argument is refused before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

from .cluster.remote import resolve_hosts, without_user
from .display import Display, is_display
from .display.panel import DISPLAYS
from .errors import LaunchArgumentError
from .launchers import HostSettings, launch
from .plan import make_plan


def notebook_launcher(
    function: Callable[..., Any],
    args: Sequence[Any] = (),
    num_processes: int | None = None,
    mixed_precision: Literal["no", "fp16", "bf16", "fp8"] = "no",
    use_port: str | int = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: Literal["static", "c10d"] = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
    *,
    start_method: Literal["auto", "fork", "spawn"] = "auto",
    device: Literal["auto", "cpu", "cuda", "xla"] = "auto",
    backend: str = "auto",
    timeout: float | None = None,
    hang_warning: float | None = 30.0,
    debug: bool | None = None,
    config_file: str | None = None,
    memory_limit: int | str | None = None,
    display: Literal["auto", "panel", "text"] | Display = "auto",
    hosts: Sequence[str] | None = None,
    hostfile: str | None = None,
    ssh_options: Sequence[str] | None = None,
    start_hosts_with: Literal["ssh", "mpirun", "srun"] = "ssh",
    mpirun_options: Sequence[str] | None = None,
    slurm_options: Sequence[str] | None = None,
    results: Literal["auto", "all", "rank0"] = "auto",
) -> Any:
    """Run ``function(*args)`` on ``num_processes`` ranks from a notebook and return rank 0's return value.

    Accelerate-compatible: every keyword up to ``log_line_prefix_template`` means what it means in
    ``accelerate.notebook_launcher``. Ours are keyword-only:

    - ``start_method``: ``"auto"`` forks when safe (fast; the workers inherit the notebook's state) and spawns
      otherwise (CUDA already initialized in this kernel, or no fork on this platform), sending the function and
      args with cloudpickle; it prints one line saying which and why. ``"fork"``/``"spawn"`` force it.
    - ``device``: ``"auto"`` (CUDA GPUs if any, one rank per GPU, else CPU), ``"cpu"``, ``"cuda"``, ``"xla"``
      (a TPU host's devices, or PJRT's CPU device, one rank each through torch_xla's ``xmp.spawn``;
      ``num_processes`` may be left out: it is the device count).
    - ``backend``: ``"auto"`` (nccl on CUDA, gloo on CPU) or a torch.distributed backend name.
    - ``timeout``: seconds; a run still going after it is stopped and a ``LaunchTimeoutError`` shows where every
      rank was (its collective, call site and Python stacks) and which rank diverged. With or without a
      timeout, ranks waiting in a collective 2 s after another rank finished are diagnosed the same way.
    - ``hang_warning``: seconds (default 30; None turns it off) of the stall watchdog: when no rank has made
      progress for that long while at least one waits in a collective, a ``hang_notice`` event (in the run log,
      ``last_run().events`` and the display) says where every rank is, which one diverged and their Python
      stacks; the run goes on (a slow rank may just be slow) and a second notice says when progress resumes.
      Progress: a rank completed a collective (its own or DDP's), called ``report(step=...)`` or started its
      function.
    - ``debug``: debug mode (see ``notebook_launcher.ops``): every collective first checks that the ranks agree
      on operation, shapes and dtypes and raises ``DistributedOperationException`` at once if not. None (the
      default) follows ``ACCELERATE_DEBUG_MODE``, else ``debug:`` in ``config_file`` (else
      ``ACCELERATE_CONFIG_FILE``, else Accelerate's default config file); False turns it off whatever they say.
    - ``memory_limit``: bytes (or "3GB") of address space per worker: a worker over it fails with a clear
      out-of-memory error (and ``find_executable_batch_size`` retries smaller, all ranks together).
    - ``results``: which return values come back to the kernel: ``"auto"`` (rank 0's, and every other rank's
      that pickles to 64 MB or less), ``"all"``, or ``"rank0"`` (only rank 0's: the others are never sent).
      ``last_run().results`` holds them by rank and ``last_run().results_left_out`` says which were not sent. A
      value that cannot be rebuilt in the kernel raises ``ResultUnavailableError`` once the run is over.
    - ``display``: ``"auto"`` shows the live run panel in a Jupyter kernel (one output, updated while the run
      goes on: a column per rank, progress from ``report()`` or tqdm, shape-mismatch cards, out-of-memory
      retries, the root cause first; saved with the notebook) and prefixed text lines elsewhere. ``"panel"`` or
      ``"text"`` force one; ``$NOTEBOOK_LAUNCHER_DISPLAY`` sets what "auto" means.

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

    ``last_run()`` gives the Run afterwards: results and exit codes by rank, events, the run log directory.
    """
    __tracebackhide__ = True  # IPython: the error is the story, not the launcher's frames
    if isinstance(display, type):
        raise LaunchArgumentError(
            f"display={display.__name__} is a class: pass an instance, display={display.__name__}(...), or one of "
            f"{', '.join(map(repr, DISPLAYS))}")
    if not (display in DISPLAYS if isinstance(display, str) else is_display(display)):
        raise LaunchArgumentError(
            f"display={display!r} is not one of {', '.join(map(repr, DISPLAYS))}: use \"auto\" (the live panel in "
            f"Jupyter, text elsewhere), \"panel\" or \"text\"")
    hosts = resolve_hosts(hosts, hostfile, num_nodes, node_rank, ssh_options, start_hosts_with, mpirun_options,
                          slurm_options)
    if hosts:
        num_nodes, master_addr = len(hosts), without_user(hosts[0])
    plan = make_plan(
        function=function, args=args, num_processes=num_processes, mixed_precision=mixed_precision,
        use_port=use_port, master_addr=master_addr, node_rank=node_rank, num_nodes=num_nodes,
        rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint, rdzv_conf=rdzv_conf, rdzv_id=rdzv_id,
        max_restarts=max_restarts, monitor_interval=monitor_interval,
        log_line_prefix_template=log_line_prefix_template, start_method=start_method, device=device,
        backend=backend, timeout=timeout, hang_warning=hang_warning, debug=debug, config_file=config_file,
        memory_limit=memory_limit, results=results, in_workers=bool(hosts))
    settings = HostSettings(hosts, ssh_options, start_hosts_with, mpirun_options, slurm_options) if hosts else None
    return launch(plan, display, settings)
