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

    def show(self, event: Event) -> None:
        """Write the event's lines (``describe.py`` says what they are) as they arrive."""
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

    def show_lines(self, lines: list) -> None:
        """``show`` for plain lines read together (Events, ``StreamLines``, ``LogRecords``): each stream's lines in
        one write."""
        parts: list[str] = []
        target = self._last_stream
        for item in lines:
            prefix = self._prefixes.get(item.rank) or self.prefix(item.rank)
            if type(item) is StreamLines:
                stream = "stderr" if item.stream == "stderr" else "stdout"
                text = prefix + ("\n" + prefix).join(item.texts) + "\n"
            elif type(item) is LogRecords:
                stream, text = "stdout", "".join([_record_text(frame, prefix) for frame in item.frames])
            elif item.kind == STREAM and len(data := item.data) == 2:  # {"stream", "text"}
                stream, text = data.get("stream"), f"{prefix}{data.get('text')}\n"
                if stream != "stderr":
                    stream = "stdout"
            elif item.kind == LOG and (line := _one_line_record(item.data)):  # describe's, without its Description
                stream, text = "stdout", f"{prefix}{line}\n"
            else:
                said = None if item.data.get("redraw") else describe(item.kind, item.data, item.rank)
                if said is None or not said.said:
                    continue
                stream = "stderr" if said.kind in STDERR_KINDS else "stdout"
                text = "".join(f"{prefix}{line}\n" for line in said.said)
            if stream != target and parts:
                self._write(target, "".join(parts))
                parts = []
            target = stream
            parts.append(text)
        if parts:
            self._write(target, "".join(parts))

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


def _one_line_record(data: dict) -> str:
    """The line ``describe`` makes of a log record that is one printable line (no exception text or stack), or
    "" for any other record."""
    if "message" not in data or type(data.get("level")) is not str or data.get("exc_text") or data.get("stack"):
        return ""
    line = log_line(data["level"], data.get("logger"), data["message"])
    return line if line.isprintable() else ""
