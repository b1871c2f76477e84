"""Where every rank is, without its cooperation, and when waiting there has become a hang.

Each rank's wrapped collectives keep a small record in shared memory up to date (``progress_record``: the
collective it is inside, since when, its call site); the kernel reads them at any time, even while a rank is
blocked inside a C++ collective and can say nothing on its pipes.
"""

from __future__ import annotations

import os

from .progress_record import ProgressRecord

HANG_GRACE_S = 2.0  # how long ranks may wait in a collective after another rank has finished


class HangWatch:
    """The progress records of one attempt's ranks, in ``directory`` (none when it is empty)."""

    def __init__(self, directory: str):
        self.directory = directory
        self._records: dict[int, ProgressRecord] = {}

    def path_for(self, rank: int) -> str:
        """The file of ``rank``'s record (created now), or "" when records are not kept."""
        if not self.directory:
            return ""
        path = os.path.join(self.directory, f"progress-{rank}.bin")
        self._records[rank] = ProgressRecord(path, create=True)
        return path

    def read(self) -> dict[int, dict]:
        return {rank: record.read() for rank, record in self._records.items()}

    def is_hang(self, done: set[int], now: float) -> bool:
        """A rank has waited in a collective for HANG_GRACE_S while a rank in ``done`` (finished or exited) will
        never join it. (Any other stall is the timeout's to catch.)"""
        if not self._records or not done:
            return False
        waits = [now - record["since"] for rank, record in self.read().items()
                 if rank not in done and record["inside"]]
        return bool(waits) and max(waits) >= HANG_GRACE_S

    def snapshot(self, states: dict[int, str], now: float) -> dict[int, dict]:
        """rank -> its record (collective, sequence, call site, since), ``now`` and its ``state`` as given."""
        records = self.read()
        return {rank: {**records.get(rank, {}), "now": now, "state": state} for rank, state in states.items()}

    def close(self) -> None:
        for record in self._records.values():
            record.close()
