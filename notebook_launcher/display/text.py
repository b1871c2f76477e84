"""The plain-text display: each worker line, prefixed with its rank, as it arrives.

This is what terminal IPython, plain python, nbconvert and any frontend without the JupyterLab extension show.
Lines are written to the kernel's ``sys.stdout``/``sys.stderr`` at the time they arrive, so inside Jupyter they
land in the launching cell (the loop runs in the cell's own thread).
"""

from __future__ import annotations

import string
import sys

from ..events import EXIT, FAILURE, LAUNCHER, STREAM, Event


class TextDisplay:
    def __init__(self, prefix_template: str, node_rank: int = 0, num_processes: int = 1):
        self._template = string.Template(prefix_template)
        self._node_rank = node_rank
        self._num_processes = num_processes
        self._prefixes: dict[int, str] = {}

    def prefix(self, rank: int) -> str:
        """torch elastic's template variables: ${rank}, ${local_rank}, ${role_name}; plus ${node_rank}."""
        if rank not in self._prefixes:
            self._prefixes[rank] = self._template.safe_substitute(
                rank=rank, local_rank=rank - self._node_rank * self._num_processes, role_name="default",
                node_rank=self._node_rank)
        return self._prefixes[rank]

    def show(self, event: Event) -> None:
        if event.kind == STREAM:
            out = sys.stderr if event.data.get("stream") == "stderr" else sys.stdout
            out.write(f"{self.prefix(event.rank)}{event.data['text']}\n")
        elif event.kind == FAILURE:
            sys.stderr.write(f"{self.prefix(event.rank)}failed: {event.data.get('type')}: "
                             f"{str(event.data.get('message', '')).splitlines()[0] if event.data.get('message') else ''}\n")
        elif event.kind == EXIT and event.data.get("signal_name") and not event.data.get("stopped_by_launcher"):
            sys.stderr.write(f"{self.prefix(event.rank)}killed by {event.data['signal_name']}\n")
        elif event.kind == LAUNCHER:
            sys.stdout.write(f"notebook_launcher: {event.data.get('text', '')}\n")

    @staticmethod
    def note(text: str) -> None:
        sys.stdout.write(f"notebook_launcher: {text}\n")
        sys.stdout.flush()
