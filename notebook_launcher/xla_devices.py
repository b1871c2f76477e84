"""XLA devices as the kernel sees them before a launch: which PJRT runtime, how many devices, how torch_xla will
lay them out, all without initializing the XLA runtime here (a TPU can be opened by one process only, and
torch_xla refuses to spawn from a process whose runtime is up).

Kernel side. torch_xla's ``xmp.spawn`` decides the processes itself and takes no count (``nprocs`` must be None):
on a TPU VM one process per chip, with a thread per core where a chip has two (v2, v3); on PJRT's CPU device one
process with a thread per device (``CPU_NUM_DEVICES``). ``num_processes`` is checked against that count.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass

from .errors import LaunchArgumentError

CPU_DEVICES_VAR = "CPU_NUM_DEVICES"


@dataclass(frozen=True)
class XlaLayout:
    """The devices of this host and how torch_xla runs them."""

    runtime: str  # "CPU" | "TPU"
    devices: int  # ordinals on this host: the launch's ranks
    processes: int  # processes torch_xla starts
    env: dict  # what the XLA host process needs set (PJRT_DEVICE, CPU_NUM_DEVICES)

    @property
    def threads_per_process(self) -> int:
        return self.devices // self.processes

    def describe(self) -> str:
        """For the launch's first line."""
        where = f"PJRT {self.runtime}"
        if self.threads_per_process == 1:
            return f"{where}: one process per device"
        if self.processes == 1:
            return f"{where}: {self.devices} devices as threads of one process, whose C/C++ output shows under rank 0"
        return (f"{where}: {self.devices} devices as threads of {self.processes} processes, whose C/C++ output "
                f"shows under each one's lowest rank")


def tpu_detected() -> bool:
    """A TPU host as Accelerate recognises one: torch_xla installed and a TPU named in the environment."""
    if importlib.util.find_spec("torch_xla") is None:
        return False
    return bool(os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR")
                or os.environ.get("PJRT_DEVICE", "").upper() == "TPU")


def import_xla_multiprocessing():
    """torch_xla's multiprocessing module, or an error that says how to get it."""
    try:
        return importlib.import_module("torch_xla.distributed.xla_multiprocessing")
    except ImportError as exc:
        raise LaunchArgumentError(
            "device='xla' needs torch_xla, which is not importable here "
            f"({exc}). Install it (pip install 'torch_xla[tpu]') on a TPU host, or use device='cpu'/'cuda'."
        ) from exc


def xla_runtime_initialized() -> bool:
    """Whether this process already started the XLA runtime (an XLA tensor was made in the notebook)."""
    torch_xla = sys.modules.get("torch_xla")
    is_initialized = getattr(getattr(torch_xla, "_XLAC", None), "_xla_runtime_is_initialized", None)
    return bool(is_initialized is not None and is_initialized())


def xla_layout(num_processes) -> XlaLayout:
    """The devices torch_xla will run, with ``num_processes`` checked against them (None: all of them)."""
    if importlib.util.find_spec("torch_xla") is None:
        import_xla_multiprocessing()  # raises the error that says how to get it
    runtime = os.environ.get("PJRT_DEVICE", "").split("_")[0].upper()
    if not runtime:
        runtime = "TPU" if tpu_chips() > 0 else "CPU"  # as torch_xla picks when PJRT_DEVICE is not set
    if runtime == "CPU":
        return _cpu_layout(num_processes)
    if runtime == "TPU":
        return _tpu_layout(num_processes)
    raise LaunchArgumentError(
        f"device='xla' with PJRT_DEVICE={os.environ['PJRT_DEVICE']!r}: only TPU and PJRT's CPU device are "
        f"supported; for GPUs use device='cuda'")


def _cpu_layout(num_processes) -> XlaLayout:
    """PJRT's CPU device: CPU_NUM_DEVICES devices in one process. ``num_processes`` sets the count where the
    environment does not."""
    given = os.environ.get(CPU_DEVICES_VAR)
    if given is not None:
        try:
            devices = int(given)
        except ValueError:
            raise LaunchArgumentError(f"{CPU_DEVICES_VAR}={given!r} is not a number of devices") from None
        if devices < 1:
            raise LaunchArgumentError(f"{CPU_DEVICES_VAR}={given!r} must be 1 or more")
        _check_count(num_processes, devices, f"PJRT's CPU device has {devices} device(s) here "
                                             f"({CPU_DEVICES_VAR}={given} in the environment)",
                     f"or set os.environ['{CPU_DEVICES_VAR}'] = '{num_processes}' before the launch")
    else:
        devices = 1 if num_processes is None else _count(num_processes)
    return XlaLayout("CPU", devices, 1, {"PJRT_DEVICE": "CPU", CPU_DEVICES_VAR: str(devices)})


def _tpu_layout(num_processes) -> XlaLayout:
    """A TPU VM: torch_xla's own count of this host's chips and cores (read from PCI and the TPU's metadata,
    before any runtime exists)."""
    try:
        tpu = importlib.import_module("torch_xla._internal.tpu")
        processes = tpu.num_local_processes()
        devices = processes * tpu.num_logical_cores_per_chip()
    except Exception as exc:  # noqa: BLE001 - torch_xla's metadata lookups raise many kinds
        raise LaunchArgumentError(
            f"device='xla': torch_xla could not count this host's TPU devices ({type(exc).__name__}: {exc}); "
            f"is this a TPU VM? On a machine without a TPU, set PJRT_DEVICE=CPU to try PJRT's CPU device") from exc
    if devices < 1:
        raise LaunchArgumentError("device='xla' with PJRT_DEVICE=TPU, but torch_xla finds no TPU chip on this "
                                  "host; set PJRT_DEVICE=CPU to try PJRT's CPU device")
    _check_count(num_processes, devices, f"this host has {devices} TPU device(s), by torch_xla's count", "")
    return XlaLayout("TPU", devices, processes, {"PJRT_DEVICE": "TPU"})


def tpu_chips() -> int:
    """TPU chips attached to this host, by torch_xla's own PCI scan (0 where it cannot tell)."""
    try:
        return importlib.import_module("torch_xla._internal.tpu").num_available_chips()
    except Exception:  # noqa: BLE001
        return 0


def _count(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"num_processes must be an int such as 8, got {type(value).__name__}: {value!r}")
    if value < 1:
        raise LaunchArgumentError(f"num_processes={value} must be 1 or more")
    return value


def _check_count(num_processes, devices: int, what: str, other_fix: str) -> None:
    if num_processes is not None and _count(num_processes) != devices:
        fix = f"pass num_processes={devices} (or leave it out){', ' + other_fix if other_fix else ''}"
        raise LaunchArgumentError(
            f"num_processes={num_processes}, but {what}, and torch_xla runs one rank on every device (it takes "
            f"no count of its own). Fix: {fix}.")
