"""The plain-text display: each worker line, prefixed with its rank, as it arrives.

This is what terminal IPython, plain python, nbconvert and any frontend without the JupyterLab extension show.
Lines are written to the kernel's ``sys.stdout``/``sys.stderr`` at the time they arrive, so inside Jupyter they
land in the launching cell (the loop runs in the cell's own thread).
"""

from __future__ import annotations

import string
import sys

from ..schema.events import (
    FAILURE,
    LOG,
    RECORD_DATA,
    RECORD_KEYS,
    RECORD_LEVEL,
    RECORD_LOGGER,
    RECORD_MESSAGE,
    STREAM,
    TEXT_ESCAPED,
    Event,
)
from ..schema.lines import LogRecords, StreamLines
from ..schema.wiretext import wire_text
from .describe import LAUNCHER_KINDS, STDERR_KINDS, describe, launcher_line, log_line
from .protocol import Display


class TextDisplay(Display):
    """Rank-prefixed lines on the kernel's stdout and stderr (``prefix_template``: torch elastic's)."""

    def __init__(self, prefix_template: str, node_rank: int = 0, num_processes: int = 1):
        self._template = string.Template(prefix_template)
        self._node_rank = node_rank
        self._num_processes = num_processes
        self._prefixes: dict[int, str] = {}
        self._last_stream = "stdout"
        self._said: set[str] = set()  # failures every rank raises, shown once

    def prefix(self, rank: int) -> str:
        """torch elastic's template variables: ${rank}, ${local_rank}, ${role_name}; plus ${node_rank}."""
        if rank not in self._prefixes:
            self._prefixes[rank] = self._template.safe_substitute(
                rank=rank, local_rank=rank - self._node_rank * self._num_processes, role_name="default",
                node_rank=self._node_rank)
        return self._prefixes[rank]

    shows_runs = True  # (protocol.py) a run of lines comes whole: its lines in one write

    def show(self, event: Event) -> None:
        """Write the event's lines (``describe.py`` says what they are) as they arrive; a run of lines
        (``lines.StreamLines``, ``LogRecords``) in one write."""
        kind = type(event)
        if kind is StreamLines:
            if event.texts:
                prefix = self._prefixes.get(event.rank) or self.prefix(event.rank)
                self._write("stderr" if event.stream == "stderr" else "stdout",
                            prefix + ("\n" + prefix).join(event.texts) + "\n")
            return
        if kind is LogRecords:
            if not event.frames:
                return
            prefix = self._prefixes.get(event.rank) or self.prefix(event.rank)
            self._write("stdout", "".join([_record_text(frame, prefix) for frame in event.frames]))
            return
        if event.kind == STREAM and event.data.get("redraw"):
            return  # a progress bar's intermediate state: its final line comes with its newline
        said = describe(event.kind, event.data, event.rank)
        if said is None or not said.said:
            return
        if event.kind == FAILURE:
            if event.data.get("all_ranks_raise") and said.text in self._said:
                return  # every rank raises the same error (debug mode): it is shown once
            self._said.add(said.text)
        elif event.kind == TEXT_ESCAPED:
            if TEXT_ESCAPED in self._said:
                return  # once per run, whichever ranks escaped text
            self._said.add(TEXT_ESCAPED)
        lines = said.said
        prefix = "" if said.kind in LAUNCHER_KINDS else self._prefixes.get(event.rank) or self.prefix(event.rank)
        text = f"{prefix}{lines[0]}\n" if len(lines) == 1 else "".join(f"{prefix}{line}\n" for line in lines)
        self._write("stderr" if said.kind in STDERR_KINDS else "stdout", text)

    def _write(self, stream: str, text: str) -> None:
        """Write to the kernel's stdout or stderr, flushing the other one first so the two keep their order."""
        if stream != self._last_stream:
            (sys.stderr if self._last_stream == "stderr" else sys.stdout).flush()
            self._last_stream = stream
        (sys.stderr if stream == "stderr" else sys.stdout).write(wire_text(text))  # (the last line of defence)

    def retarget(self, node_rank: int, ranks) -> None:
        """The rendezvous gave this node its rank (c10d): prefixes use the new local ranks."""
        self._node_rank = node_rank
        self._prefixes.clear()

    def tick(self) -> None:
        """Nothing to refresh: lines are written as they arrive."""

    @staticmethod
    def note(text: str) -> None:
        sys.stdout.write(f"{launcher_line(text)}\n")
        sys.stdout.flush()


def _record_text(frame: tuple, prefix: str) -> str:
    """What ``show`` writes for a record frame of ``LogRecords``: ``describe``'s one line, made without the
    Description when it is printable as it is."""
    line = log_line(frame[RECORD_LEVEL], frame[RECORD_LOGGER], frame[RECORD_MESSAGE])
    if line.isprintable():
        return f"{prefix}{line}\n"
    return "".join(f"{prefix}{line}\n" for line in describe(LOG, dict(zip(RECORD_KEYS, frame[RECORD_DATA]))).said)
