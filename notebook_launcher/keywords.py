"""The keywords of ``notebook_launcher()``, declared once.

Its signature (what ``help()`` and a notebook's Shift-Tab show), the keyword part of its docstring, the README's
table, the plan's defaults and ``%%accelerate``'s options are all made from ``LaunchKeywords``: adding a keyword is
one field here and its check in ``plan.make_plan`` (or in ``cluster.remote`` for a keyword of the hosts); what the
plan holds reaches the hosts' agents by itself (``launch_plan.LaunchPlan.for_agent``).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .display import Display


def _keyword(default: Any, doc: str, *, accelerate: bool = False, hosts: bool = False, option: dict | None = None):
    """A field with what the docs say of it; ``accelerate``: positional as in Accelerate's launcher; ``hosts``:
    a keyword of where ranks start, not of the plan; ``option``: its ``%%accelerate`` option, as argparse's
    ``add_argument`` takes it (``flags``: default ``--the-name``), ``help`` at least."""
    return field(default=default, metadata={"doc": doc, "accelerate": accelerate, "hosts": hosts, "option": option})


def seconds_or_off(text: str) -> float | None:
    """An option's number of seconds, or "off"/"none"/"no" for None."""
    if text.strip().lower() in ("off", "none", "no"):
        return None
    return float(text)


@dataclass(frozen=True)
class LaunchKeywords:
    """Every keyword of ``notebook_launcher`` with its default, as the user gave them (checked by ``make_plan``)."""

    num_processes: int | None = _keyword(
        None, "ranks per host; None: one per GPU, else 2 on CPU (the XLA device count on XLA)", accelerate=True,
        option={"flags": ("-n", "--num-processes"), "type": int,
                "help": "ranks to start (default: one per GPU, else 2 on CPU; the device count on XLA)"})
    mixed_precision: Literal["no", "fp16", "bf16", "fp8"] = _keyword(
        "no", "ACCELERATE_MIXED_PRECISION in every rank, read by `Accelerator()`", accelerate=True,
        option={"help": "no, fp16, bf16 or fp8 (ACCELERATE_MIXED_PRECISION)"})
    use_port: str | int = _keyword(
        "29500", "MASTER_PORT; a free one is used if it is taken (single-node runs)", accelerate=True,
        option={"flags": ("--port",), "help": "master port (a free one is used if it is taken)"})
    master_addr: str = _keyword("127.0.0.1", "MASTER_ADDR: node 0's address", accelerate=True)
    node_rank: int = _keyword(0, "this node's number when the same notebook runs on every node", accelerate=True)
    num_nodes: int = _keyword(1, "how many nodes run this notebook (each calls `notebook_launcher`)",
                              accelerate=True)
    rdzv_backend: Literal["static", "c10d"] = _keyword(
        "static", "`\"c10d\"`: torch's rendezvous at `rdzv_endpoint`, nodes may join in any order", accelerate=True)
    rdzv_endpoint: str = _keyword("", "`host:port` of the c10d rendezvous", accelerate=True)
    rdzv_conf: dict | None = _keyword(None, "extra rendezvous settings, as torch elastic takes them",
                                      accelerate=True)
    rdzv_id: str = _keyword("none", "the rendezvous' run id", accelerate=True)
    max_restarts: int = _keyword(0, "relaunch all ranks after a failure up to that many times", accelerate=True)
    monitor_interval: float = _keyword(0.1, "seconds between the kernel's checks of its workers", accelerate=True)
    log_line_prefix_template: str | None = _keyword(
        None, "prefix of each rank's lines, default `\"[rank ${rank}] \"` (`${rank}`, `${local_rank}`)",
        accelerate=True)
    start_method: Literal["auto", "fork", "spawn"] = _keyword(
        "auto", "`\"auto\"` forks when safe (fast; the workers inherit the notebook's state) and spawns otherwise "
        "(CUDA already initialized in this kernel, or no fork on this platform), sending the function and args "
        "with cloudpickle; one line says which and why. `\"fork\"`/`\"spawn\"` force it",
        option={"help": "auto, fork or spawn"})
    device: Literal["auto", "cpu", "cuda", "xla"] = _keyword(
        "auto", "`\"auto\"` (CUDA GPUs if any, one rank per GPU, else CPU), `\"cpu\"`, `\"cuda\"`, `\"xla\"` (a TPU "
        "host's devices, or PJRT's CPU device, one rank each through torch_xla's `xmp.spawn`; `num_processes` may be "
        "left out: it is the device count)", option={"help": "auto, cpu, cuda or xla"})
    backend: str = _keyword("auto", "`\"auto\"` (nccl on CUDA, gloo on CPU) or a torch.distributed backend name")
    timeout: float | None = _keyword(
        None, "seconds; a run still going after it is stopped and a `LaunchTimeoutError` shows where every rank "
        "was (its collective, call site and stack) and which rank diverged. With or without it, ranks waiting in a "
        "collective 2 s after another rank finished are diagnosed the same way",
        option={"type": float, "help": "seconds before the run is stopped and diagnosed"})
    hang_warning: float | None = _keyword(
        30.0, "seconds a rank waits in a collective while no other rank of its process group makes progress, "
        "before a hang notice says where every rank is and which diverged (the run goes on; a second notice says "
        "when progress resumes); None: off. Progress: a collective completed (its own or DDP's; not one of a rank "
        "alone), a `report(step=...)`, a function started",
        option={"type": seconds_or_off, "metavar": "S",
                "help": "seconds without progress (a rank waiting in a collective) before a hang notice; off: none"})
    debug: bool | None = _keyword(
        None, "debug mode: every collective first checks that the ranks agree on operation, shapes and dtypes and "
        "raises `DistributedOperationException` at once if not. None follows `ACCELERATE_DEBUG_MODE`, else "
        "`debug:` in `config_file`; False turns it off whatever they say",
        option={"action": "store_const", "const": True, "help": "debug mode: collectives check shapes first"})
    config_file: str | None = _keyword(
        None, "an Accelerate config file whose `debug:` and `mixed_precision:` are read (default: "
        "`ACCELERATE_CONFIG_FILE`, else Accelerate's default file)")
    memory_limit: int | str | None = _keyword(
        None, "bytes (or `\"3GB\"`) of address space per worker: a worker over it fails with a clear out-of-memory "
        "error (and `find_executable_batch_size` retries smaller, all ranks together)",
        option={"help": "per-worker address-space cap, e.g. 3GB"})
    display: Literal["auto", "panel", "text"] | Display = _keyword(
        "auto", "`\"auto\"`: the live run panel in a Jupyter kernel (a column per rank, progress, mismatch cards, "
        "out-of-memory retries, the root cause first; saved with the notebook), prefixed text lines elsewhere; "
        "`\"panel\"` or `\"text\"` force one; `$NOTEBOOK_LAUNCHER_DISPLAY` sets what \"auto\" means", hosts=True,
        option={"flags": ("--text",), "action": "store_const", "const": "text",
                "help": "plain rank-prefixed lines ([rank 0] ...) instead of the live run panel"})
    hosts: Sequence[str] | None = _keyword(
        None, "hosts to start `num_processes` ranks on each (SSH by default); the first is node 0", hosts=True)
    hostfile: str | None = _keyword(None, "a file with one host per line, instead of `hosts`", hosts=True)
    ssh_options: Sequence[str] | None = _keyword(
        None, "arguments for ssh, e.g. `[\"-p\", \"2222\", \"-i\", key]`", hosts=True)
    start_hosts_with: Literal["ssh", "mpirun", "srun"] = _keyword(
        "ssh", "how the hosts' agents start: `\"ssh\"`, `\"mpirun\"` (the MPI found), or `\"srun\"` (a step of "
        "the Slurm job this kernel runs in, one agent per node; or of the allocation `slurm_options` asks for)",
        hosts=True)
    mpirun_options: Sequence[str] | None = _keyword(
        None, "arguments added to mpirun's command line", hosts=True)
    slurm_options: Sequence[str] | None = _keyword(
        None, "salloc's options (e.g. `[\"--nodes=2\", \"--time=1:00:00\"]`): from outside a Slurm job, ask for "
        "the allocation first (its job id and squeue's reason shown while it waits; given back at the end)",
        hosts=True)
    detach: bool = _keyword(
        False, "run under a supervisor process of its own, which outlives this kernel: returns a `DetachedRun` "
        "(`.status`, `.progress`, `.result()`, `.stop()`; displayed, the live panel) once the ranks started; "
        "`attach(run_id)` picks it up from any kernel of the same user. Not yet with `hosts`, `num_nodes>1` or "
        "`device=\"xla\"`", hosts=True,
        option={"action": "store_true", "help": "run detached from this kernel (attach(run_id) picks it up)"})
    detach_for: float | str | None = _keyword(
        None, "with `detach=True`: the run's lifetime once no kernel follows it any more, in seconds or as `\"30m\"`, "
        "`\"12h\"`, `\"2d\"`; past it the run is stopped as `stop()` does. None: it runs to its end", hosts=True,
        option={"flags": ("--detach-for",), "metavar": "DURATION",
                "help": "with --detach: stop the run this long (e.g. 12h) after the last kernel left it"})
    results: Literal["auto", "all", "rank0"] = _keyword(
        "auto", "which return values come back: `\"auto\"` (rank 0's, and every other rank's that pickles to 64 MB "
        "or less), `\"all\"`, or `\"rank0\"`; `last_run().results` holds them by rank")

    def for_plan(self) -> dict:
        """The keywords ``make_plan`` checks (not those of where ranks start)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.metadata["hosts"]}


def magic_options() -> list[tuple[tuple[str, ...], dict]]:
    """``%%accelerate``'s option for each keyword that has one, as (flags, ``add_argument``'s keywords): its
    destination is the keyword and its default the keyword's, so the magic passes them on as they are."""
    options = []
    for f in fields(LaunchKeywords):
        if f.metadata["option"] is not None:
            settings = dict(f.metadata["option"])
            flags = settings.pop("flags", ("--" + f.name.replace("_", "-"),))
            options.append((flags, {**settings, "dest": f.name, "default": f.default}))
    return options


def signature(function_name: str = "function") -> inspect.Signature:
    """``notebook_launcher``'s signature: the function, ``args``, Accelerate's keywords (positional too, in
    Accelerate's order), then ours, keyword-only."""
    parameters = [inspect.Parameter(function_name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                    annotation="Callable[..., Any]"),
                  inspect.Parameter("args", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=(),
                                    annotation="Sequence[Any]")]
    for f in fields(LaunchKeywords):
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if f.metadata["accelerate"] else inspect.Parameter.KEYWORD_ONLY
        parameters.append(inspect.Parameter(f.name, kind, default=f.default, annotation=f.type))
    return inspect.Signature(parameters, return_annotation="Any")


def bind(signature_: inspect.Signature, positional: tuple, keywords: dict) -> tuple[Any, tuple, LaunchKeywords]:
    """What a call passed, as (function, args, LaunchKeywords); an unknown keyword names the closest one."""
    unknown = [name for name in keywords if name not in signature_.parameters]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], list(signature_.parameters), n=1)
        hint = f": did you mean {close[0]}=?" if close else ": see help(notebook_launcher) for its keywords"
        raise TypeError(f"notebook_launcher() got an unexpected keyword argument {unknown[0]!r}{hint}")
    bound = signature_.bind(*positional, **keywords)
    given = dict(bound.arguments)
    function = given.pop(next(iter(signature_.parameters)))
    args = given.pop("args", ())
    return function, args, LaunchKeywords(**given)


def docstring_list() -> str:
    """The keyword part of ``help(notebook_launcher)``: one bullet per keyword."""
    import textwrap

    return "\n".join(textwrap.fill(f"- ``{f.name}={f.default!r}``: {f.metadata['doc'].replace('`', '``')}.",
                                   width=110, subsequent_indent="  ") for f in fields(LaunchKeywords))


def readme_table() -> str:
    """The README's table of keywords (``tests/test_keywords.py`` checks that the README shows this one)."""
    rows = ["| keyword | default | what it does |", "|---|---|---|"]
    for f in fields(LaunchKeywords):
        default = "" if f.default is MISSING else repr(f.default).replace("'", '"')
        marker = " (Accelerate's)" if f.metadata["accelerate"] else ""
        rows.append(f"| `{f.name}`{marker} | `{default}` | {f.metadata['doc'].replace('|', '/')} |")
    return "\n".join(rows)
