"""Making the launch plan (``launch_plan.LaunchPlan``): every argument checked in the kernel before any process
starts.

Choosing the device, backend, start method, port and the number of ranks (``num_processes=None``) happens here,
once, for ``notebook_launcher()`` and ``%%accelerate`` alike, so that the supervisor only executes a plan and the
error for a bad argument names the parameter and the fix. A host's agent rebuilds the kernel's plan here too
(``plan_on_agent``), deciding only what depends on its host.
"""

from __future__ import annotations

import os
import re
import socket
import sys

from .accelerate_config import resolve_debug
from .errors import LaunchArgumentError
from .keywords import LaunchKeywords
from .launch_plan import LaunchPlan
from .schema.results import RESULT_CHOICES
from .xla_devices import tpu_detected, xla_layout, xla_runtime_initialized

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16", "fp8")
START_METHOD_CHOICES = ("auto", "fork", "spawn")
DEVICE_CHOICES = ("auto", "cpu", "cuda", "xla")
BACKEND_CHOICES = ("auto", "gloo", "nccl", "mpi", "ucc", "xccl")
RDZV_BACKEND_CHOICES = ("static", "c10d", "etcd", "etcd-v2")
DEFAULT_PREFIX_TEMPLATE = "[rank ${rank}] "
MAX_MONITOR_INTERVAL_S = 60
DEFAULT_CPU_RANKS = 2  # num_processes=None on CPU
MAX_RANKS_PER_CORE = 8  # CPU ranks beyond this are refused: each is a process with torch loaded
FDS_PER_RANK = 8  # the kernel's descriptors per rank while it starts (3 pipes, both ends) and after (+ pidfd)

# Libraries whose import is known to initialize CUDA in the importing process (so fork is no longer safe).
KNOWN_CUDA_INITIALIZERS = ("bitsandbytes", "pycuda.autoinit", "cupy", "numba.cuda", "tensorflow", "jax")


def make_plan(function, args=(), *, in_workers: bool = False, detached: bool = False, **keywords) -> LaunchPlan:
    """Check every argument (``keywords``: those of ``notebook_launcher``, its defaults for the others), decide
    device, backend and start method; ``in_workers``: ranks start on hosts' agents, even one; ``detached``: a
    detached run's supervisor runs them (even one rank in a worker). No I/O but looking."""
    given = LaunchKeywords(**keywords)  # an unknown keyword is a TypeError here, as in a call
    if not callable(function):
        raise TypeError(f"function must be callable (the training function to run on every rank), "
                        f"got {type(function).__name__}: {function!r}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list of positional arguments, got {type(args).__name__}; "
                        f"for one argument write args=(value,)")
    mixed_precision = _choice("mixed_precision", str(given.mixed_precision).lower(), MIXED_PRECISION_CHOICES)
    start_method = _choice("start_method", given.start_method, START_METHOD_CHOICES)
    results = _choice("results", given.results, RESULT_CHOICES)
    device = _choice("device", given.device, DEVICE_CHOICES)
    backend = _choice("backend", given.backend, BACKEND_CHOICES)
    rdzv_backend = _choice("rdzv_backend", given.rdzv_backend, RDZV_BACKEND_CHOICES)
    num_nodes = _positive_int("num_nodes", given.num_nodes)
    node_rank = _int("node_rank", given.node_rank)
    if not 0 <= node_rank < num_nodes:
        raise LaunchArgumentError(f"node_rank={node_rank} must be between 0 and num_nodes - 1 = {num_nodes - 1}")
    max_restarts = _int("max_restarts", given.max_restarts)
    if max_restarts < 0:
        raise LaunchArgumentError(f"max_restarts={max_restarts} must be 0 or more")
    monitor_interval = _positive_number("monitor_interval", given.monitor_interval)
    if monitor_interval > MAX_MONITOR_INTERVAL_S:
        raise LaunchArgumentError(f"monitor_interval={monitor_interval:g} s is longer than {MAX_MONITOR_INTERVAL_S} "
                                  f"s: the kernel checks its workers this often; leave the default (0.1 s)")
    timeout, hang_warning = given.timeout, given.hang_warning
    if timeout is not None:
        timeout = _positive_number("timeout", timeout)
    if hang_warning is not None:
        hang_warning = _positive_number("hang_warning", hang_warning)
    debug = resolve_debug(given.debug, given.config_file)
    memory_limit = parse_memory_limit(given.memory_limit)
    rdzv_conf, log_line_prefix_template = given.rdzv_conf, given.log_line_prefix_template
    if rdzv_conf is not None and not isinstance(rdzv_conf, dict):
        raise TypeError(f"rdzv_conf must be a dict or None, got {type(rdzv_conf).__name__}")
    if log_line_prefix_template is not None and not isinstance(log_line_prefix_template, str):
        raise TypeError("log_line_prefix_template must be a string such as '[${rank}]: ' or None")
    if num_nodes > 1 and rdzv_backend not in ("static", "c10d"):
        raise LaunchArgumentError(
            f"rdzv_backend={rdzv_backend!r} with num_nodes={num_nodes} is not supported (torch's etcd rendezvous "
            f"is deprecated); use rdzv_backend='c10d' with rdzv_endpoint='host:port', or 'static' with "
            f"master_addr and use_port set to node 0's address and a free port")

    rdzv_endpoint, master_addr = given.rdzv_endpoint, given.master_addr
    if rdzv_endpoint:
        master_addr, endpoint_port = _split_endpoint(rdzv_endpoint)
        requested_port = _port(endpoint_port, name=f"the port of rdzv_endpoint={rdzv_endpoint!r}")
    else:
        requested_port = _port(given.use_port)
    if not isinstance(master_addr, str) or not master_addr:
        raise LaunchArgumentError(f"master_addr must be a host name or address string, got {master_addr!r}")
    if not in_workers:  # (across hosts= the agents find node 0's address; an SSH alias need not resolve here)
        _check_resolves(master_addr, "rdzv_endpoint" if rdzv_endpoint else "master_addr")

    if device == "auto":
        device = detect_device()
    xla = None
    if device == "xla":
        if num_nodes > 1:
            raise LaunchArgumentError(f"device='xla' with num_nodes={num_nodes}: a launch runs the XLA devices of "
                                      f"this host only; leave num_nodes at 1")
        xla = xla_layout(given.num_processes)
        num_processes = xla.devices
    else:
        num_processes = _num_processes(given.num_processes, device)
    backend = _backend(backend, device)
    start_method, reason = choose_start_method(start_method, device)
    cpu_threads = _cpu_threads(device, num_processes)
    return LaunchPlan(
        function=function, args=tuple(args), num_processes=num_processes, num_nodes=num_nodes,
        node_rank=node_rank, device=device, backend=backend, start_method=start_method,
        start_method_reason=reason, master_addr=master_addr, master_port=requested_port,
        requested_port=requested_port,
        mixed_precision=mixed_precision, timeout=timeout, max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        log_line_prefix_template=DEFAULT_PREFIX_TEMPLATE if log_line_prefix_template is None
        else log_line_prefix_template,
        rdzv_backend=rdzv_backend, rdzv_conf=dict(rdzv_conf or {}), rdzv_id=str(given.rdzv_id), cpu_threads=cpu_threads,
        debug=debug, memory_limit=memory_limit, results=results, in_workers=in_workers, detached=detached,
        hang_warning=hang_warning, xla=xla,
    )


def plan_on_agent(carried: dict, function, args, master_addr: str, master_port: int) -> LaunchPlan:
    """One host's plan in a launch across hosts: the kernel's, as ``LaunchPlan.for_agent`` carried it, with what
    depends on this host decided and checked here (its GPUs, limits, memory, CPU threads, XLA devices; fork, as
    nothing initialized CUDA in the agent; node 0's address and port; the agents meet there, statically)."""
    device, num_processes = carried["device"], carried["num_processes"]
    xla = xla_layout(num_processes) if device == "xla" else None
    if xla is None:
        _num_processes(num_processes, device)
    parse_memory_limit(carried["memory_limit"] or None)
    start_method, reason = choose_start_method("fork", device)
    decided = dict(function=function, args=tuple(args), start_method=start_method, start_method_reason=reason,
                   cpu_threads=_cpu_threads(device, num_processes), xla=xla, master_addr=master_addr,
                   master_port=master_port, requested_port=master_port, rdzv_backend="static",
                   in_workers=True)
    return LaunchPlan.from_agent(carried, **decided)


def _cpu_threads(device: str, num_processes: int) -> int:
    """OMP threads per CPU rank: this host's cores shared out (0: torch's default, or what OMP_NUM_THREADS says)."""
    if device == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        return max(1, _cpu_count() // num_processes)
    return 0


_UNITS = {"": 1, "B": 1, "K": 2**10, "KB": 2**10, "KIB": 2**10, "M": 2**20, "MB": 2**20, "MIB": 2**20,
          "G": 2**30, "GB": 2**30, "GIB": 2**30, "T": 2**40, "TB": 2**40, "TIB": 2**40}


def parse_memory_limit(value) -> int:
    """``memory_limit``: None, bytes as an int, or a string such as "3GB", "512MiB", "1.5G" (powers of 1024)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise TypeError("memory_limit must be bytes (an int) or a string such as '3GB', not a bool")
    if isinstance(value, int):
        amount = value
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if not match or match.group(2).upper() not in _UNITS:
            raise LaunchArgumentError(f"memory_limit={value!r} is not a size: write bytes or e.g. '3GB', '512MB'")
        number = float(match.group(1)) * _UNITS[match.group(2).upper()]
        amount = int(number) if number < 2**64 else 2**64  # (the most is checked below)
    else:
        raise TypeError(f"memory_limit must be bytes (an int) or a string such as '3GB', got {type(value).__name__}")
    if amount < 64 * 2**20:
        raise LaunchArgumentError(f"memory_limit={value!r} is below 64 MB: a worker with torch loaded needs more")
    machine = _machine_memory()
    if machine and amount > machine:
        raise LaunchArgumentError(
            f"memory_limit={value!r} is more than this machine's memory ({machine / 2**30:.1f} GiB of RAM and swap),"
            f" so it would limit nothing: give at most {machine / 2**30:.1f} GiB (e.g. "
            f"memory_limit=\"{max(1, int(machine / 2**30 / 2))}GB\" per worker), or None for no limit")
    return amount


def _machine_memory() -> int:
    """This machine's RAM and swap in bytes (0 if unknown)."""
    try:
        with open("/proc/meminfo") as meminfo:
            sizes = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo if ":" in line}
        return sizes.get("MemTotal", 0) + sizes.get("SwapTotal", 0)
    except (OSError, ValueError, IndexError):
        try:
            return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            return 0


def _choice(name: str, value, choices) -> str:
    if value not in choices:
        raise LaunchArgumentError(f"{name}={value!r} is not one of {', '.join(repr(c) for c in choices)}")
    return value


def _int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    return value


def _positive_int(name: str, value) -> int:
    value = _int(name, value)
    if value < 1:
        raise LaunchArgumentError(f"{name}={value} must be 1 or more")
    return value


def _positive_number(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}: {value!r}")
    if not value > 0:
        raise LaunchArgumentError(f"{name}={value} must be more than 0 seconds")
    return float(value)


def _num_processes(value, device: str) -> int:
    gpus = cuda_device_count() if device == "cuda" else 0
    available = f"{gpus} CUDA GPU(s)" if device == "cuda" else f"{_cpu_count()} CPU core(s)"
    if value is None:  # (on XLA, the device count: xla_layout)
        if device == "cpu":
            return _num_processes(DEFAULT_CPU_RANKS, device)
        if not gpus:
            raise LaunchArgumentError("num_processes=None on device='cuda' means one rank per GPU, but no CUDA GPU "
                                      "is visible here: pass device='cpu' (or 'auto'), or check CUDA_VISIBLE_DEVICES")
        value = gpus
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"num_processes must be an int such as 2, got {type(value).__name__}: {value!r}")
    if value < 1:
        raise LaunchArgumentError(f"num_processes={value} must be 1 or more (this machine has {available})")
    if device == "cuda" and value > gpus:
        raise LaunchArgumentError(
            f"num_processes={value} asks for more GPU ranks than the {gpus} CUDA GPU(s) visible here (one rank "
            f"per GPU); use num_processes={gpus} or less, or device='cpu'")
    if device == "cpu" and value > _cpu_count() * MAX_RANKS_PER_CORE:
        raise LaunchArgumentError(
            f"num_processes={value} is more than {MAX_RANKS_PER_CORE} ranks per CPU core on this machine "
            f"({_cpu_count()} core(s), so at most {_cpu_count() * MAX_RANKS_PER_CORE}): each rank is a whole "
            f"process with torch loaded. Use num_processes={_cpu_count()} (one per core) or fewer")
    _check_process_limits(value)
    return value


def _check_process_limits(num_processes: int) -> None:
    """The kernel holds about ``FDS_PER_RANK`` descriptors per rank (its pipes and its pidfd) and each rank is a
    process: refuse a launch that would run out of either half-way through starting."""
    import resource

    open_files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = num_processes * FDS_PER_RANK + 64
    if open_files != resource.RLIM_INFINITY and needed > open_files:
        raise LaunchArgumentError(
            f"num_processes={num_processes} needs about {needed} open files in this kernel, more than its limit of "
            f"{open_files}: start fewer ranks, or raise the limit before the launch (`ulimit -n {needed}` before "
            f"starting Jupyter, or resource.setrlimit(resource.RLIMIT_NOFILE, ...) in the notebook)")
    processes, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if processes != resource.RLIM_INFINITY and num_processes > processes:
        raise LaunchArgumentError(
            f"num_processes={num_processes} is more than this user may start (RLIMIT_NPROC {processes}): start "
            f"fewer ranks, or raise the limit (`ulimit -u`)")


def _check_resolves(host: str, name: str) -> None:
    """A master address that does not resolve would leave every rank retrying to connect until ``timeout``."""
    try:
        socket.getaddrinfo(host.strip("[]"), None)
    except (socket.gaierror, UnicodeError) as exc:
        raise LaunchArgumentError(
            f"{name}: the host {host!r} cannot be resolved here ({exc}): give node 0's host name or IP address "
            f"(the default is '127.0.0.1' for a launch on this machine)") from None


def _backend(backend: str, device: str) -> str:
    if backend == "auto":
        return {"cuda": "nccl", "xla": "xla", "cpu": "gloo"}[device]
    if backend == "nccl" and device != "cuda":
        raise LaunchArgumentError(f"backend='nccl' needs CUDA GPUs but device={device!r}; use backend='gloo'")
    if backend == "mpi":
        import torch.distributed as dist

        if not dist.is_mpi_available():
            raise LaunchArgumentError("backend='mpi' but this torch was built without MPI; use backend='gloo'")
    return backend


def _split_endpoint(endpoint: str) -> tuple[str, str]:
    host, sep, port = str(endpoint).rpartition(":")
    if not sep or not host:
        raise LaunchArgumentError(f"rdzv_endpoint={endpoint!r} must look like 'host:port'")
    return host.strip("[]"), port


def _port(value, name: str = "use_port") -> int:
    shown = f"{name}={value!r}" if name == "use_port" else f"{name} ({value!r})"
    try:
        port = int(str(value))
    except ValueError:
        raise LaunchArgumentError(f"{shown} must be a port number such as '29500'") from None
    if not 1 <= port <= 65535:
        raise LaunchArgumentError(f"{shown} is out of range: use a port between 1 and 65535")
    return port


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cuda_device_count() -> int:
    """GPUs visible here, counted through NVML so the kernel's CUDA stays uninitialized (fork stays safe)."""
    torch = _torch()
    if not torch.backends.cuda.is_built():
        return 0
    return torch.cuda.device_count()


def detect_device() -> str:
    if tpu_detected():
        return "xla"
    if cuda_device_count() > 0:
        return "cuda"
    return "cpu"


def cuda_initialized() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def kernel_process_group_initialized() -> bool:
    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def cuda_initializer_suspects() -> list[str]:
    """Modules already imported in the kernel that are known to initialize CUDA on import."""
    return [name for name in KNOWN_CUDA_INITIALIZERS if name in sys.modules]


def choose_start_method(requested: str, device: str) -> tuple[str, str]:
    """fork when it is safe (fast, inherits the notebook's state), else spawn with cloudpickle."""
    fork_available = hasattr(os, "fork")
    unsafe = None
    if not fork_available:
        unsafe = "this platform has no fork"
    elif sys.platform == "darwin":
        unsafe = "fork is unsafe on macOS"
    elif device == "cuda" and cuda_initialized():
        unsafe = "CUDA is already initialized in this kernel" + _suspects_note()
    elif device == "xla" and xla_runtime_initialized():
        unsafe = ("the XLA runtime is already initialized in this kernel (an XLA device or tensor was used in the "
                  "notebook); torch_xla cannot start its processes from a copy of it")
    elif kernel_process_group_initialized():
        unsafe = ("torch.distributed is already initialized in this kernel (a forked worker would inherit its "
                  "sockets); call torch.distributed.destroy_process_group() in the kernel")
    if requested == "spawn":
        return "spawn", "requested"
    if requested == "fork":
        if unsafe:
            raise LaunchArgumentError(fork_unsafe_message(unsafe))
        return "fork", "requested"
    if unsafe:
        return "spawn", f"fork is not safe here ({unsafe})"
    return "fork", "safe here" + (" (CUDA not initialized in this kernel)" if device == "cuda" else "")


def spawns(requested: str, device: str) -> bool:
    """Whether a launch with these ``start_method`` and ``device`` keywords would spawn (and so pickle what its
    function uses): asked before the launch by ``%%accelerate``, to name an unpicklable notebook name."""
    if requested != "auto":
        return requested == "spawn"
    return choose_start_method("auto", detect_device() if device == "auto" else device)[0] == "spawn"


def _suspects_note() -> str:
    suspects = cuda_initializer_suspects()
    return f" (probably by `import {suspects[0]}`)" if suspects else ""


def fork_unsafe_message(why: str) -> str:
    fix = "pass start_method='spawn' (the function and its arguments are then sent with cloudpickle)"
    if "XLA runtime" in why:
        fix = ("restart the kernel and make XLA tensors only inside the launched function, or " + fix)
    if "CUDA" in why:
        fix = ("restart the kernel and keep CUDA out of it before the launch (move imports such as bitsandbytes "
               "and any .cuda()/.to('cuda') calls inside the launched function), or " + fix)
    return f"start_method='fork' cannot be used: {why}. Fix: {fix}."


def _torch():
    import torch

    return torch
