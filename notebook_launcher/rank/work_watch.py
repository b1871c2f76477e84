"""An async collective's wait in the progress record, and the process group of every recorded collective.

``dist.all_reduce(t, async_op=True)`` returns at once with a ``Work``; the rank waits later, in ``work.wait()``
(or polling ``work.is_completed()``, or in ``work.get_future().wait()``). There, blocked in C++, the record
would say nothing: so each async collective that ``collectives`` records is remembered with its number, and a wait
for it is recorded as waiting in that collective (``ProgressRecord.enter_wait``: "all_reduce #3, in its
wait()"), from the moment the wait starts (for polling: the first ``is_completed()`` that said False) until it
returns (completed: True). ``Work``'s and ``Future``'s methods are replaced on their classes, in the rank's
process only, so every reference sees them; a Work nobody recorded (torch's own, DDP's) waits as before.

``group_members``: the members of a collective's process group as the record keeps them, so that the kernel
judges a hang only against the ranks of that group.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

from ..schema.progress_record import members_bitmap
from . import context

_Work = dist.distributed_c10d.Work
_Future = torch._C.Future
_pending: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Work or its Future -> _Launched
_originals: dict = {}
_site = None  # collectives.call_site, given by install() (collectives imports this module)
_MEMBERS: dict = {}  # process group -> its members bitmap


class _Launched:
    """An async collective the record numbered, and the slot its wait is recorded in while polled."""

    __slots__ = ("sequence", "operation", "members", "polled")

    def __init__(self, sequence: int, operation: str, members: bytes):
        self.sequence, self.operation, self.members = sequence, operation, members
        self.polled: int | None = None  # the slot recording its wait, since an is_completed() said False


def group_members(group) -> bytes:
    """The members bitmap of process ``group`` for the record: b"" for the default group (every rank)."""
    if group is None or group is dist.GroupMember.WORLD:
        return b""
    members = _MEMBERS.get(group)
    if members is None:
        if len(_MEMBERS) > 64:
            _MEMBERS.clear()
        members = _MEMBERS[group] = members_bitmap(dist.get_process_group_ranks(group))
    return members


def launched(work, sequence: int, operation: str, members: bytes) -> None:
    """``work`` is what async collective #``sequence`` returned: its waits are recorded from now on."""
    if isinstance(work, _Work):
        _pending[work] = _Launched(sequence, operation, members)


def install(site) -> None:
    """Waits for the works ``launched`` names are recorded; ``site()`` is the user's line
    (``collectives.call_site``)."""
    global _site
    _site = site
    if not _originals:
        for owner, name, replacement in _PATCHES:
            _originals[owner, name] = getattr(owner, name)
            setattr(owner, name, replacement)


def _waiting(original):
    """A blocking wait of a Work or Future, recorded as waiting in its collective where it is one."""

    def wait(self, *args, **kwargs):
        entry, progress = _pending.get(self), context.current.progress
        if entry is None or progress is None:
            return original(self, *args, **kwargs)
        slot = progress.enter_wait(entry.sequence, entry.operation, _site(), entry.members)
        try:
            return original(self, *args, **kwargs)
        finally:
            progress.leave_wait(slot, entry.sequence)
            _pending.pop(self, None)

    wait.__name__, wait.__qualname__, wait.__doc__ = original.__name__, original.__qualname__, original.__doc__
    return wait


def _is_completed(self) -> bool:
    done = _originals[_Work, "is_completed"](self)
    entry, progress = _pending.get(self), context.current.progress
    if entry is not None and progress is not None:
        if done:
            if entry.polled is not None:
                progress.leave_wait(entry.polled, entry.sequence)
            _pending.pop(self, None)
        elif entry.polled is None:
            entry.polled = progress.enter_wait(entry.sequence, entry.operation, _site(), entry.members)
    return done


def _get_future(self):
    future = _originals[_Work, "get_future"](self)
    entry = _pending.get(self)
    if entry is not None:
        try:
            _pending[future] = entry
        except TypeError:  # (a future that takes no weak reference: its wait is not recorded)
            pass
    return future


_is_completed.__doc__ = _Work.is_completed.__doc__
_get_future.__doc__ = _Work.get_future.__doc__
_PATCHES = ((_Work, "wait", _waiting(_Work.wait)), (_Work, "is_completed", _is_completed),
            (_Work, "get_future", _get_future), (_Future, "wait", _waiting(_Future.wait)))
