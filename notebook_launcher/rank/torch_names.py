"""The private names of torch and Accelerate that the rank side patches or reads, in one list.

Each hook degrades to doing nothing where its name is missing (a torch that renamed it), so that a launch never
fails for a watch it could not set up. That used to be silent: now ``tests/test_torch_internals.py`` asserts
every name exists on the installed versions (torch 2.13 in ``make test``, 2.9 in ``make test-xla``), and a
launch whose torch lacks one says so once, naming what is lost (``missing()``).
"""

from __future__ import annotations

import importlib
import sys

# (module, attribute path in it, the module of ours that needs it, what is lost without it)
PRIVATE_NAMES = (
    ("torch.nn.parallel.distributed", "DistributedDataParallel.__init__", "ddp_watch",
     "DDP models are not watched"),
    ("torch.nn.parallel.distributed", "DistributedDataParallel._post_forward", "ddp_watch",
     "DDP's gradient all_reduce is not recorded"),
    ("torch.nn.parallel.distributed", "DistributedDataParallel._sync_buffers", "ddp_watch",
     "DDP's buffer broadcast is not recorded"),
    ("torch.nn.parallel.distributed", "_DDPJoinHook.main_hook", "ddp_watch", "DDP's join is not recorded"),
    ("torch.nn.parallel.distributed", "_verify_param_shape_across_processes", "ddp_watch",
     "DDP's construction is not recorded"),
    ("torch.nn.parallel.distributed", "_sync_module_states", "ddp_watch", "DDP's construction is not recorded"),
    ("torch.autograd", "_engine_run_backward", "ddp_watch", "DDP's backward is not recorded"),
    ("torch.autograd", "Variable._execution_engine", "ddp_watch", "DDP's wait in backward is not measured"),
    ("torch.distributed.distributed_c10d", "_get_default_group", "ops",
     "debug mode's check takes torch's all_gather"),
    ("torch.distributed.distributed_c10d", "_rank_not_in_group", "ops",
     "collectives of groups this rank is not in are checked"),
    ("torch.distributed.distributed_c10d", "AllgatherOptions", "ops", "debug mode's check takes torch's all_gather"),
    ("torch.distributed.distributed_c10d", "_world", "ops", "debug mode's check takes torch's all_gather"),
    ("torch.distributed.distributed_c10d", "_all_gather_base", "ops",
     "the legacy _all_gather_base is neither recorded nor checked"),
    ("torch.distributed.distributed_c10d", "_reduce_scatter_base", "ops",
     "the legacy _reduce_scatter_base is neither recorded nor checked"),
    ("torch.distributed.distributed_c10d", "_get_default_store", "worker",
     "ranks leave without waiting for each other"),
    ("torch", "UntypedStorage._cdata", "results", "views of one tensor come back as separate tensors"),
    ("torch.storage", "TypedStorage._untyped_storage", "results", "old-style storages are pickled whole"),
    ("accelerate.state", "PartialState.__init__", "accelerate_state",
     "a bare PartialState() on CPU ranks is not distributed"),
    ("accelerate.state", "PartialState._shared_state", "accelerate_state",
     "Accelerate's state made in the notebook leaks into the ranks"),
    ("accelerate.state", "AcceleratorState._shared_state", "accelerate_state",
     "Accelerate's state made in the notebook leaks into the ranks"),
    ("accelerate.state", "GradientState._shared_state", "accelerate_state",
     "Accelerate's state made in the notebook leaks into the ranks"),
)

# names that exist on instances only: an instance to look them up on
_INSTANCES = {
    "UntypedStorage": lambda torch: torch.UntypedStorage(1),
    "TypedStorage": lambda torch: torch.storage.TypedStorage(wrap_storage=torch.UntypedStorage(4),
                                                             dtype=torch.float32, _internal=True),
}


def missing(import_missing_modules: bool = False) -> list[str]:
    """What this process's torch (and Accelerate, if imported) lacks of ``PRIVATE_NAMES``, one line each.

    A module not imported yet is looked at only with ``import_missing_modules`` (the kernel imports nothing for
    this, Accelerate least of all); one that cannot be imported (Accelerate not installed) lacks nothing."""
    lines = []
    for module_name, path, user, lost in PRIVATE_NAMES:
        module = sys.modules.get(module_name)
        if module is None:
            if not import_missing_modules:
                continue
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
        if not _has(module, path):
            lines.append(f"{module_name}.{path} (used by {user}): {lost}")
    return lines + _hidden_collectives()


def _hidden_collectives() -> list[str]:
    """A collective whose place in torch.distributed holds something that does not lead to torch's own
    function (an object of the user's, no ``__wrapped__``): it cannot be watched; its call still works."""
    if "torch.distributed" not in sys.modules:
        return []
    from .collectives import HIDDEN  # (imports torch.distributed, which is imported already)

    return [f"torch.distributed.distributed_c10d.{name} (used by ops): replaced by an object of type "
            f"{type(value).__name__} that hides torch's function, so this collective is neither recorded nor "
            f"checked in debug mode"
            for name, value in HIDDEN.items()]


def _has(module, path: str) -> bool:
    owner_name, _, name = path.rpartition(".")
    owner = getattr(module, owner_name, None) if owner_name else module
    if owner is None:
        return False
    if hasattr(owner, name):
        return True
    make = _INSTANCES.get(owner_name)
    if make is None:
        return False
    try:
        return hasattr(make(sys.modules["torch"]), name)
    except Exception:  # noqa: BLE001 - a storage API that changed is a missing name too
        return False
