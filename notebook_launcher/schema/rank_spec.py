"""The start of one rank's process, as the kernel tells it (``supervision/starters.py``) and the rank reads it
(``rank/worker.py``, ``rank/xla_host.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class RankSpec:
    """What the kernel tells one rank's process at its start: who it is, where to write, how to join the group.
    (Not torch elastic's ``WorkerSpec``, which describes a whole group of workers.)

    Under fork the spec is inherited as an object; under spawn it travels as JSON in the environment variable
    ``NOTEBOOK_LAUNCHER_WORKER``, so this dataclass is the whole contract between the two sides.
    """

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: str  # "cpu" | "cuda" | "xla"
    backend: str  # "gloo" | "nccl" | ...
    env: dict  # torch.distributed and ACCELERATE_* variables for this rank
    events_fd: int
    stdout_fd: int
    stderr_fd: int
    parent_pid: int
    cpu_threads: int  # intra-op threads for torch on CPU runs; 0 leaves torch's default
    payload_path: str = ""  # spawn only: the cloudpickled (function, args)
    store_listen_fd: int = -1  # rank 0 only: the kernel's listening socket for the TCPStore server
    debug: bool | None = None  # debug mode forced on/off; None: ACCELERATE_DEBUG_MODE decides at each call
    progress_path: str = ""  # the rank's progress record (see ProgressRecord)
    result_paths: list = field(default_factory=list)  # the kernel's in-memory files for a large result
    # (see result_memory.py); empty: the pipe
    memory_limit: int = 0  # bytes of address space the worker may use (RLIMIT_AS); 0: no limit
    explicit_store: bool = False  # True: connect to the store at MASTER_ADDR:MASTER_PORT that rank 0 serves
    results: str = "auto"  # which ranks send their return value (see results.py)
    # device "xla": this one process is the XLA host of every rank; [rank, events, stdout, stderr] of the others
    ordinal_fds: list = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> RankSpec:
        return cls(**json.loads(text))
