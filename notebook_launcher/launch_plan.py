"""The launch plan as a record: what the supervisor executes, each rank's environment, and the one form in which
it travels to the hosts' agents (``for_agent`` / ``from_agent``), made from the dataclass's fields so that a field
added here reaches every host without another line.

``plan.py`` makes it (every argument checked, device, backend and start method decided).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from .xla_devices import XlaLayout

# Not carried to a host's agent: the function and args travel pickled (the payload); the rest is decided on each
# host, by ``plan.plan_on_agent``: its start method, CPU threads and XLA devices, and node 0's address and port
# (the kernel tells each agent where node 0's store is: a static rendezvous).
DECIDED_ON_EACH_HOST = ("function", "args", "start_method", "start_method_reason", "cpu_threads", "xla",
                        "master_addr", "master_port", "requested_port", "rdzv_backend", "in_workers")


@dataclass
class LaunchPlan:
    """Everything the supervisor needs, already checked."""

    function: object
    args: tuple
    num_processes: int
    num_nodes: int
    node_rank: int
    device: str
    backend: str
    start_method: str
    start_method_reason: str
    master_addr: str
    master_port: int  # the launcher replaces it with the port it reserved for each attempt
    requested_port: int
    mixed_precision: str
    timeout: float | None
    max_restarts: int
    monitor_interval: float
    log_line_prefix_template: str
    rdzv_backend: str
    rdzv_conf: dict
    rdzv_id: str
    cpu_threads: int
    port_note: str = ""
    memory_limit: int = 0  # bytes per worker; 0: none
    batch_sizes: dict | None = None  # find_executable_batch_size sizes agreed after an out-of-memory restart
    debug: bool | None = None  # None: each worker follows ACCELERATE_DEBUG_MODE as its function sets it
    results: str = "auto"  # which ranks' return values come back (see results.py)
    hang_warning: float | None = 30.0  # the stall watchdog's quiet seconds before a hang notice; None: off
    in_workers: bool = False  # even one rank in a worker (a launch across hosts: its events carry the result)
    detached: bool = False  # run by a detached run's supervisor (detach=True): even one rank in a worker
    xla: XlaLayout | None = None  # device "xla": the devices torch_xla runs (one rank each)

    @property
    def runs_in_kernel(self) -> bool:
        """One process on one node: the function runs in the kernel itself (never on XLA: the kernel must not
        start the XLA runtime, or no later launch could)."""
        return (self.num_processes == 1 and self.num_nodes == 1 and not self.in_workers and not self.detached
                and self.device != "xla")

    @property
    def spawns_workers(self) -> bool:
        return self.start_method == "spawn" and not self.runs_in_kernel

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_processes

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.num_processes + local_rank

    def env_for(self, local_rank: int) -> dict:
        """The torch.distributed and Accelerate environment of one rank."""
        env = {
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "RANK": str(self.global_rank(local_rank)),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.num_processes),
            "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank),
            "ACCELERATE_MIXED_PRECISION": self.mixed_precision,
        }
        if self.debug is not None:
            env["ACCELERATE_DEBUG_MODE"] = "true" if self.debug else "false"  # Accelerate reads it too
        if self.batch_sizes:
            env["NOTEBOOK_LAUNCHER_BATCH_SIZES"] = json.dumps(self.batch_sizes)
        if self.xla is not None:
            env.update(self.xla.env)
        if self.device == "cpu":
            env["ACCELERATE_USE_CPU"] = "true"
            if self.cpu_threads:
                env["OMP_NUM_THREADS"] = str(self.cpu_threads)
        return env

    def describe(self) -> str:
        """The one line the kernel prints before starting: what, where, and why this start method."""
        where = f"{self.num_processes} process{'es' if self.num_processes != 1 else ''}"
        if self.xla is not None:
            where = f"{self.num_processes} ordinal{'s' if self.num_processes != 1 else ''} ({self.xla.describe()})"
        if self.num_nodes > 1:
            where += f" on node {self.node_rank} of {self.num_nodes} (world size {self.world_size})"
        return (f"{where} on {self.device} ({self.backend}), "
                f"start method {self.start_method}: {self.start_method_reason}"
                + (f"; {self.port_note}" if self.port_note else ""))

    def for_agent(self, node_rank: int) -> dict:
        """Node ``node_rank``'s plan as JSON takes it: every field but those ``DECIDED_ON_EACH_HOST``."""
        carried = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in DECIDED_ON_EACH_HOST}
        return json.loads(json.dumps({**carried, "node_rank": node_rank}))  # a field JSON cannot carry fails here

    @classmethod
    def from_agent(cls, carried: dict, **on_this_host) -> LaunchPlan:
        """The plan ``for_agent`` sent, with ``on_this_host`` giving every field ``DECIDED_ON_EACH_HOST``."""
        return cls(**carried, **on_this_host)
