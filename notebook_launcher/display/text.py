"""The plain-text display: each worker line, prefixed with its rank, as it arrives.

This is what terminal IPython, plain python, nbconvert and any frontend without the JupyterLab extension show.
Lines are written to the kernel's ``sys.stdout``/``sys.stderr`` at the time they arrive, so inside Jupyter they
land in the launching cell (the loop runs in the cell's own thread).
"""

from __future__ import annotations

import string
import sys

from ..events import EXIT, FAILURE, LAUNCHER, LOG, OOM_RETRY, RESTART, STREAM, TRIGGER, Event


class TextDisplay:
    def __init__(self, prefix_template: str, node_rank: int = 0, num_processes: int = 1):
        self._template = string.Template(prefix_template)
        self._node_rank = node_rank
        self._num_processes = num_processes
        self._prefixes: dict[int, str] = {}
        self._last_stream = "stdout"
        self._said: set[tuple] = set()

    def prefix(self, rank: int) -> str:
        """torch elastic's template variables: ${rank}, ${local_rank}, ${role_name}; plus ${node_rank}."""
        if rank not in self._prefixes:
            self._prefixes[rank] = self._template.safe_substitute(
                rank=rank, local_rank=rank - self._node_rank * self._num_processes, role_name="default",
                node_rank=self._node_rank)
        return self._prefixes[rank]

    def show(self, event: Event) -> None:
        prefix = self.prefix(event.rank)
        if event.kind == STREAM:
            if event.data.get("redraw"):
                return  # a progress bar's intermediate state: its final line comes with its newline
            self._write(event.data.get("stream", "stdout"), f"{prefix}{event.data['text']}\n")
        elif event.kind == LOG and "message" in event.data:
            data = event.data
            text = f"{data.get('level')} {data.get('logger')}: {data['message']}".rstrip("\n")
            lines = text.splitlines()
            for extra in (data.get("exc_text"), data.get("stack")):
                if extra:
                    lines += extra.splitlines()
            self._write("stdout", "".join(f"{prefix}{line}\n" for line in lines))
        elif event.kind == FAILURE:
            first_line = str(event.data.get("message", "")).split("\n", 1)[0]
            said = (event.data.get("type"), first_line)
            if event.data.get("all_ranks_raise") and said in self._said:
                return  # every rank raises the same error (debug mode): it is shown once
            self._said.add(said)
            self._write("stderr", f"{prefix}failed: {event.data.get('type')}: {first_line}\n")
        elif event.kind == EXIT and event.data.get("signal_name") and not event.data.get("stopped_by_launcher"):
            self._write("stderr", f"{prefix}killed by {event.data['signal_name']}\n")
        elif event.kind == TRIGGER:
            self._write("stdout", f"{prefix}set_trigger() at {event.data.get('call_site')}: the next "
                                  "check_trigger() returns True on every rank\n")
        elif event.kind == OOM_RETRY:
            data = event.data
            ranks = ", ".join(str(rank) for rank in data.get("ranks", [event.rank]))
            self._write("stdout", f"notebook_launcher: rank {ranks} ran out of memory at batch size "
                                  f"{data['batch_size']} ({data['error']}); restarting all ranks at batch size "
                                  f"{data['new_batch_size']}\n")
        elif event.kind == LAUNCHER or event.kind == RESTART and event.data.get("reason") != "out of memory":
            self._write("stdout", f"notebook_launcher: {event.data.get('text', '')}\n")

    def _write(self, stream: str, text: str) -> None:
        """Write to the kernel's stdout or stderr, flushing the other one first so the two keep their order."""
        if stream != self._last_stream:
            (sys.stderr if self._last_stream == "stderr" else sys.stdout).flush()
            self._last_stream = stream
        (sys.stderr if stream == "stderr" else sys.stdout).write(text)

    def retarget(self, node_rank: int, ranks) -> None:
        """The rendezvous gave this node its rank (c10d): prefixes use the new local ranks."""
        self._node_rank = node_rank
        self._prefixes.clear()

    def tick(self) -> None:
        """Nothing to refresh: lines are written as they arrive."""

    @staticmethod
    def note(text: str) -> None:
        sys.stdout.write(f"notebook_launcher: {text}\n")
        sys.stdout.flush()
