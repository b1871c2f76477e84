"""The troubleshooting guide as automatic checks: ``doctor()``, ``env_report()``.

Each check gives a verdict (ok / warning / problem), what it found, and the fix. Also as ``%accelerate_doctor`` in
a notebook and ``python -m notebook_launcher doctor`` (``... env`` for the report to paste into a bug report).
"""

from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from .cluster.remote import (  # noqa: F401
    OK,
    PROBLEM,
    WARNING,
    Check,
    check_ssh,
    mpi_implementation,
    mpi_sanity_run,
    read_hostfile,  # the SSH and MPI checks live with the helpers a launch across hosts uses
)
from .cluster.slurm_checks import slurm_checks
from .errors import LaunchArgumentError


@dataclass
class DoctorReport:
    checks: list = field(default_factory=list)

    @property
    def problems(self) -> list:
        return [check for check in self.checks if check.verdict == PROBLEM]

    def __getitem__(self, name: str) -> Check:
        return next(check for check in self.checks if check.name == name)

    def __str__(self) -> str:
        lines = []
        for check in self.checks:
            lines.append(f"[{check.verdict:^7}] {check.name}: {check.found}")
            if check.fix and check.verdict != OK:
                lines.append(f"          fix: {check.fix}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle):
        printer.text(str(self))


def doctor(num_processes: int | None = None, port: int = 29500, hostfile: str | None = None,
           ssh_options=(), kernel_release: str | None = None, gpus: list | None = None) -> DoctorReport:
    """Run every check and return the report (print it, or let the notebook show it).

    ``hostfile`` (one host per line, optional ``slots=N``) adds the multi-CPU checks: SSH without a password
    to each host and the guide's sanity run of ``mpirun ... hostname``. ``ssh_options`` are passed to ssh (e.g.
    ``["-p", "2222", "-i", "key"]``). ``kernel_release`` and ``gpus`` (dicts with name, memory_bytes,
    capability, multiprocessors) replace what this machine says, to check another setup.
    """
    report = DoctorReport()
    report.checks.append(check_kernel_release(kernel_release or platform.release()))
    report.checks.append(check_cuda_in_kernel())
    report.checks.append(check_gpus(num_processes, gpus if gpus is not None else gpu_table()))
    report.checks.append(check_port(port))
    report.checks.append(check_shared_memory())
    report.checks.append(check_open_files())
    report.checks.append(check_mpi())
    report.checks += slurm_checks()  # the Slurm job this kernel runs in, and srun from here (none without Slurm)
    if hostfile:
        try:
            hosts = read_hostfile(hostfile)
        except LaunchArgumentError as exc:  # nothing is run with a host that is not one
            report.checks.append(Check("hostfile", PROBLEM, str(exc), "fix that line of the hostfile"))
        else:
            report.checks += [check_ssh(host, ssh_options) for host in hosts]
            report.checks.append(mpi_sanity_run(hostfile, len(hosts)))
    report.checks.append(check_reproducibility())
    report.checks.append(check_detached_runs())
    return report


def check_detached_runs() -> Check:
    """The detached runs of this user going on on this machine (each one's supervisor, and its ranks, use it)."""
    from .detached import running_ids

    running = running_ids()
    if not running:
        return Check("detached runs", OK, "none running")
    listed = ", ".join(f"{run_id} (supervisor pid {pid})" for run_id, pid in running)
    return Check("detached runs", OK, f"{len(running)} running: {listed}; attach(run_id) follows one, "
                                      f"attach(run_id).stop() ends it")


def check_kernel_release(release: str) -> Check:
    """Linux below 5.5 can hang processes (the guide's warning)."""
    match = re.match(r"(\d+)\.(\d+)", release or "")
    if not match:
        return Check("Linux kernel", WARNING, f"cannot read the release {release!r}", "check `uname -r` by hand")
    version = (int(match.group(1)), int(match.group(2)))
    if version < (5, 5):
        return Check("Linux kernel", WARNING, f"{release}: older than 5.5, where processes are known to hang",
                     "upgrade the kernel to 5.5 or newer")
    return Check("Linux kernel", OK, release)


def check_cuda_in_kernel() -> Check:
    from .plan import cuda_initialized, cuda_initializer_suspects

    suspects = cuda_initializer_suspects()
    if cuda_initialized():
        culprit = f" (probably by `import {suspects[0]}`)" if suspects else ""
        return Check("CUDA in this kernel", PROBLEM, f"already initialized{culprit}: fork cannot use CUDA now",
                     "restart the kernel and move CUDA work and such imports inside the launched function, or "
                     "launch with start_method='spawn'")
    if suspects:
        return Check("CUDA in this kernel", WARNING, f"not initialized, but {', '.join(suspects)} is imported "
                     "and may initialize it", "import it inside the launched function")
    return Check("CUDA in this kernel", OK, "not initialized: workers can be forked")


def gpu_table() -> list[dict]:
    """This machine's GPUs (NVML through torch; CUDA stays uninitialized when NVML answers)."""
    import torch

    from .plan import cuda_device_count

    table = []
    for index in range(cuda_device_count()):
        properties = torch.cuda.get_device_properties(index)
        table.append({"name": properties.name, "memory_bytes": properties.total_memory,
                      "capability": f"{properties.major}.{properties.minor}",
                      "multiprocessors": properties.multi_processor_count})
    return table


def check_gpus(num_processes: int | None, gpus: list[dict]) -> Check:
    """GPUs against the ranks asked for; with mixed GPUs, which one bounds the batch size and the speed."""
    if not gpus:
        return Check("GPUs", OK, "none: ranks run on the CPU (gloo)")
    names = ", ".join(f"{gpu['name']} ({gpu['memory_bytes'] / 2**30:.0f} GiB, sm {gpu['capability']})"
                      for gpu in gpus)
    if num_processes is not None and num_processes > len(gpus):
        return Check("GPUs", PROBLEM, f"{num_processes} ranks asked for, {len(gpus)} GPU(s): {names}",
                     f"use num_processes={len(gpus)} or less (one rank per GPU)")
    if len({(gpu["name"], gpu["memory_bytes"]) for gpu in gpus}) > 1:
        smallest = min(gpus, key=lambda gpu: gpu["memory_bytes"])
        slowest = min(gpus, key=lambda gpu: (float(gpu["capability"]), gpu.get("multiprocessors", 0)))
        return Check("GPUs", WARNING, f"mixed GPUs: {names}. The batch size is bounded by {smallest['name']} "
                     f"({smallest['memory_bytes'] / 2**30:.0f} GiB) and every step waits for {slowest['name']}",
                     "size the per-device batch for the smallest GPU; expect the speed of the slowest. While a "
                     "run goes on, the panel's Balance section (after it, last_run().balance.summary()) shows "
                     "which rank the others wait for and each rank's peak memory")
    return Check("GPUs", OK, f"{len(gpus)} x {names.split(' (')[0]}: {names}")


def check_port(port: int) -> Check:
    from .cluster.ports import reserve_port

    reservation = reserve_port("127.0.0.1", port)
    busy = reservation is None or reservation.note
    if reservation is not None:
        reservation.close()
    if not busy:
        return Check("port", OK, f"{port} is free")
    return Check("port", WARNING, f"{port} is taken", "launches pick a free port by themselves on one machine; "
                 "across machines choose a free use_port")


def check_shared_memory() -> Check:
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return Check("/dev/shm", WARNING, "not found", "DataLoader workers share tensors through /dev/shm")
    size = stats.f_frsize * stats.f_blocks
    if size < 2**30:
        return Check("/dev/shm", WARNING, f"{size / 2**20:.0f} MiB: DataLoader workers may fail (Bus error)",
                     "enlarge it (docker: --shm-size=8g) or use num_workers=0")
    return Check("/dev/shm", OK, f"{size / 2**30:.1f} GiB")


def check_open_files() -> Check:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 4096:
        return Check("open files", WARNING, f"limit {soft} (hard {hard}): DataLoader workers and NCCL open many",
                     f"raise it: `ulimit -n {min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536}`")
    return Check("open files", OK, f"limit {soft}")


def check_mpi() -> Check:
    path, name = mpi_implementation()
    if not path:
        return Check("MPI", OK, "not installed (only needed to run ranks over MPI on several CPU machines)")
    return Check("MPI", OK, f"{name} at {path}")


def check_reproducibility() -> Check:
    """The effective batch size of the last run against the one before it in this kernel."""
    from .runs import recent_runs

    runs = [run for run in recent_runs() if run.batch_sizes]
    if len(runs) < 2:
        return Check("reproducibility", OK, "fewer than two runs with a known batch size in this kernel")
    before, last = runs[-2], runs[-1]
    effective = [effective_batch_size(run) for run in (before, last)]
    if effective[0] == effective[1]:
        return Check("reproducibility", OK, f"effective batch size {effective[1]} in both of the last two runs")
    return Check("reproducibility", WARNING,
                 f"effective batch size changed: {effective[0]} (per device "
                 f"{_per_device(before)} x {before.world_size}) -> {effective[1]} (per device {_per_device(last)} x "
                 f"{last.world_size})",
                 "for the same results keep the effective batch: use same_effective_batch() for the per-device "
                 "batch and learning rate, and the same seed (set_seed)")


def _per_device(run) -> int:
    return next(iter(run.batch_sizes.values()))


def effective_batch_size(run, gradient_accumulation_steps: int = 1) -> int:
    return _per_device(run) * run.world_size * gradient_accumulation_steps


def same_effective_batch(per_device_batch: int, num_processes: int, learning_rate: float, new_num_processes: int,
                         gradient_accumulation_steps: int = 1, new_gradient_accumulation_steps: int = 1) -> dict:
    """The per-device batch size (and learning rate) that keeps the effective batch size when moving from
    ``num_processes`` to ``new_num_processes``. When it does not divide evenly, the nearest per-device batch is
    used and the learning rate is scaled linearly with the effective batch actually obtained."""
    effective = per_device_batch * num_processes * gradient_accumulation_steps
    new_per_device = max(1, round(effective / (new_num_processes * new_gradient_accumulation_steps)))
    new_effective = new_per_device * new_num_processes * new_gradient_accumulation_steps
    return {"per_device_batch": new_per_device, "learning_rate": learning_rate * new_effective / effective,
            "effective_batch": new_effective, "exact": new_effective == effective}


def env_report() -> str:
    """Versions, OS, devices, relevant environment variables and config: a block to paste into a bug report."""
    import torch

    from ._version import __version__

    lines = [f"notebook_launcher: {__version__}", f"Python: {sys.version.split()[0]} ({sys.executable})",
             f"torch: {torch.__version__} (CUDA {torch.version.cuda or 'none'})"]
    try:
        import accelerate

        lines.append(f"accelerate: {accelerate.__version__}")
    except ImportError:
        lines.append("accelerate: not installed")
    lines.append(f"OS: {platform.platform()}; kernel {platform.release()}; {os.cpu_count()} CPUs")
    driver = _nvidia_driver()
    lines.append(f"NVIDIA driver: {driver or 'none found'}")
    gpus = gpu_table()
    lines.append("GPUs: " + ("; ".join(f"{g['name']} {g['memory_bytes'] / 2**30:.0f} GiB sm {g['capability']}"
                                      for g in gpus) or "none"))
    path, name = mpi_implementation()
    lines.append(f"MPI: {name + ' at ' + path if path else 'none'}")
    relevant = sorted(key for key in os.environ if key.startswith(("ACCELERATE_", "NCCL_", "CUDA_", "OMP_",
                                                                  "MASTER_", "TORCH_", "NOTEBOOK_LAUNCHER_")))
    lines.append("Environment: " + (", ".join(f"{key}={os.environ[key]}" for key in relevant) or "nothing relevant"))
    from .accelerate_config import accelerate_default_config_file

    config = os.environ.get("ACCELERATE_CONFIG_FILE") or accelerate_default_config_file()
    lines.append(f"Accelerate config: {config if os.path.isfile(config) else 'none'}")
    return "\n".join(lines)


def _nvidia_driver() -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        completed = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return completed.stdout.strip().splitlines()[0] if completed.stdout.strip() else ""
