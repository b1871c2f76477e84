"""How the ranks of a launch leave once their functions have returned: together, and without tearing the group down.

Agreed through the group's store rather than a collective barrier, so a rank that returns early waits without
any collective timeout or NCCL watchdog; and without ``destroy_process_group()``, whose joining of gloo's threads
is the largest part of a short launch (about 20 ms per rank): the process's exit tears the group down. No rank
leaves while a peer may still be talking to it, and rank 0, which serves the store, leaves last.

A rank counts itself as returned once its value is on its way to the kernel (``returned``, from
``reporting.call_and_report``), before it lets go of it: freeing a large result takes milliseconds, in which its
peers can already be exiting. (Not sooner, before a large result is packed and written: the writer threads then
have the cores, which the peers' exits would take, to themselves.) It then waits (``leave``). The last rank to
arrive at each stage sets a key the others wait for, so each learns it at once.

Worker side.
"""

from __future__ import annotations

import datetime

RETURNED_KEY = "notebook_launcher/returned"
LEFT_KEY = "notebook_launcher/left"
_WAIT_EACH = datetime.timedelta(days=1)  # (a wait's timeout; it is waited again: a peer may train on for days)


def returned(world_size: int) -> None:
    """This rank's function has returned and its value is on its way to the kernel."""
    store = _group_store()
    if store is None:
        return
    try:
        _count(store, RETURNED_KEY, world_size)
    except Exception:  # noqa: BLE001 - a peer failed (the kernel reports it) or rank 0's store is gone
        pass


def leave(world_size: int) -> None:
    """Wait until every rank has returned (``returned``), then until every other has left if this is rank 0; the
    process may exit then."""
    import torch.distributed as dist

    store = _group_store()
    if store is None:
        return
    try:
        _wait(store, RETURNED_KEY)
        _count(store, LEFT_KEY, world_size)
        if dist.get_rank() == 0:  # rank 0 serves the store: it goes last, when nobody will ask it anything
            _wait(store, LEFT_KEY)
    except Exception:  # noqa: BLE001 - a peer failed (the kernel reports it) or rank 0's store is gone
        pass


def _group_store():
    """The default group's store, or None where there is no group (one rank, or the function destroyed it)."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist.distributed_c10d._get_default_store()


def _count(store, key: str, world_size: int) -> None:
    if store.add(key, 1) == world_size:  # the last one: the others, waiting, learn it at once
        store.set(key + "/all", b"1")


def _wait(store, key: str) -> None:
    import torch.distributed as dist

    while True:  # a peer that dies is stopped by the kernel, and this rank with it
        try:
            store.wait([key + "/all"], _WAIT_EACH)
            return
        except dist.DistStoreError as exc:
            if "timeout" not in str(exc).lower():
                raise
